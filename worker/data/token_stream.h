// Token streams: the read-only token sequences a job trains and validates on.
//
// `TokenStream` is the interface; the implementations are an in-memory byte buffer (format
// "bytes" and the synthetic corpus: every byte is a token 0..255), a read-only memory map of a
// token file (format "tokens": uint16, llm.c's 256 x int32 header or nanoGPT's headerless .bin;
// format "tokens32": uint32 after llm.c's Llama 3 header), a concatenation of streams (shards)
// and a slice of a stream (the train/validation split; a view, no copy).
//
// Thread-safety: every stream is immutable after construction and Read() is safe to call from
// any number of threads at once.
#ifndef TANDEM_WORKER_DATA_TOKEN_STREAM_H_
#define TANDEM_WORKER_DATA_TOKEN_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::worker {

// llm.c token files: a header of 256 little-endian int32, header[0] = magic, header[1] =
// version, header[2] = token count, then the tokens, little-endian. GPT-2's (format "tokens"):
// magic 20240520, version 1, uint16 tokens.
inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 256 * 4;
// Llama 3's (format "tokens32"), as llm.c's dev/data/data_common.py writes them: magic
// 20240801, version 7, uint32 tokens. Tandem also reads header[3] as the token width in bytes:
// 4, or 0 (llm.c leaves it 0) meaning 4; header[4..255] are reserved and ignored.
inline constexpr int32_t kToken32FileMagic = 20240801;
inline constexpr int32_t kToken32FileVersion = 7;
inline constexpr int32_t kToken32FileWidth = 4;

// A read-only token sequence.
class TokenStream {
 public:
  virtual ~TokenStream() = default;

  // Number of tokens.
  virtual int64_t size() const = 0;
  // Copies tokens [start, start + count) into out[0, count). Requires 0 <= start, 0 <= count
  // and start + count <= size() (a programmer invariant, not checked).
  virtual void Read(int64_t start, int64_t count, int32_t* out) const = 0;
  // The largest token id present (for vocabulary checks); -1 for an empty stream.
  virtual int32_t max_token() const = 0;
};

// The index of the first token >= `limit` in `stream`, or -1 when there is none. One pass of
// Read() in chunks: meant for naming the culprit once max_token() >= limit, not for every load.
int64_t FindTokenAtLeast(const TokenStream& stream, int64_t limit);

// Every byte is a token 0..255.
std::shared_ptr<const TokenStream> MakeByteTokenStream(std::vector<uint8_t> bytes);

// Reads the file at `path` into memory as a byte stream. INVALID_ARGUMENT when it is larger
// than `max_bytes`; NOT_FOUND / PERMISSION_DENIED / ... from the OS when it cannot be read;
// every message names the file.
absl::StatusOr<std::shared_ptr<const TokenStream>> ReadByteFile(const std::string& path,
                                                                int64_t max_bytes);

// Maps the uint16 token file at `path` read-only. A file whose first int32 is
// kTokenFileMagic is an llm.c file: version must be kTokenFileVersion (else INVALID_ARGUMENT)
// and the size must be exactly kTokenFileHeaderBytes + 2 * header[2] (else DATA_LOSS). Any
// other file is headerless (nanoGPT .bin): raw uint16 tokens, so an odd size is DATA_LOSS.
// (A headerless file cannot start with the magic by accident with GPT-2 tokens: its first two
// tokens would be 55432 and 308, and 55432 is beyond GPT-2's 50257.) Errors name the file.
// A file that starts with kToken32FileMagic is refused (INVALID_ARGUMENT: use "tokens32").
// Scans the tokens once for max_token(), so opening costs one sequential read of the file.
absl::StatusOr<std::shared_ptr<const TokenStream>> MapTokenFile(const std::string& path);

// Maps the uint32 token file at `path` (format "tokens32") read-only. It must have the header:
// fewer than 4 bytes, or kToken32FileMagic and fewer than kTokenFileHeaderBytes, is DATA_LOSS
// (truncated); another magic (kTokenFileMagic says to use "tokens"), a version other than
// kToken32FileVersion or a token width other than 0 or 4 is INVALID_ARGUMENT; a size other
// than kTokenFileHeaderBytes + 4 * header[2] is DATA_LOSS. A token above INT32_MAX (beyond any
// vocabulary) is INVALID_ARGUMENT naming its index and id. Errors name the file. Scans the
// tokens once, as MapTokenFile does.
absl::StatusOr<std::shared_ptr<const TokenStream>> MapToken32File(const std::string& path);

// `parts` in order as one stream (a window may span a boundary). One part is returned as is.
// Requires the total size to fit int64_t (callers check; see LoadDataset).
std::shared_ptr<const TokenStream> ConcatTokenStreams(
    std::vector<std::shared_ptr<const TokenStream>> parts);

// Tokens [begin, begin + count) of `base`, without copying; 0 <= begin, begin + count <=
// base->size(). Its max_token() scans the slice on first call (once, thread-safe).
std::shared_ptr<const TokenStream> SliceTokenStream(std::shared_ptr<const TokenStream> base,
                                                    int64_t begin, int64_t count);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_DATA_TOKEN_STREAM_H_
