// YAML text -> protobuf message, generically through the message's descriptor, and the
// filling in of field defaults. The job spec (common/spec.h) is its one user today; nothing
// here knows about JobSpec.
//
// The message's schema is the schema of the YAML: every key must be a field name, every value
// must have the field's type (integers in range, unquoted numbers and booleans, an enum's value
// names, lists for repeated fields, maps for map fields and nested messages, one member of a
// oneof). Errors name the field path and the place in the text, in the text form of
// common/field_errors.h, e.g.
// "pipeline.micro_batches: expected an integer, got 'four' (line 3, column 19)".
//
// Thread-safety: pure functions.
#ifndef TANDEM_COMMON_PROTO_YAML_H_
#define TANDEM_COMMON_PROTO_YAML_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/field_errors.h"
#include "google/protobuf/message.h"

namespace tandem {

// Parses `yaml`, which must hold exactly one YAML document, a map, into `msg` (fields not
// written stay unset; `key:` or `key: ~` leaves a field unset). `document` names the text in
// errors ("job spec"). Every error is INVALID_ARGUMENT. An error about the whole text (invalid
// YAML, a control character, more than one document, an empty document, a top level that is
// not a map) is the only one, under the document's name: "job spec: invalid YAML: <what>
// (line L, column C)". Otherwise every field is read, and the message lists the error of each
// field that is wrong, one per line in the order written, with its path and place. On error
// `msg` holds the fields that were read. `lines`, when given, receives where each field (each
// list item, each map key) is written, also on error.
absl::Status ParseYamlMessage(absl::string_view yaml, absl::string_view document,
                              google::protobuf::Message* msg, FieldLines* lines = nullptr);

// Sets every field of `msg` that has presence and is unset to its declared default,
// recursively through nested and repeated messages (not map values), so that a stored message
// says exactly what runs. Members of a oneof stay unset: setting one would choose it.
void FillDefaults(google::protobuf::Message* msg);

}  // namespace tandem

#endif  // TANDEM_COMMON_PROTO_YAML_H_
