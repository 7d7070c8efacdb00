#include "coordinator/sqlite_db.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

// The primary result code's name, for messages a person can look up.
const char* CodeName(int rc) {
  switch (rc & 0xff) {
    case SQLITE_ERROR:
      return "SQLITE_ERROR";
    case SQLITE_INTERNAL:
      return "SQLITE_INTERNAL";
    case SQLITE_PERM:
      return "SQLITE_PERM";
    case SQLITE_ABORT:
      return "SQLITE_ABORT";
    case SQLITE_BUSY:
      return "SQLITE_BUSY";
    case SQLITE_LOCKED:
      return "SQLITE_LOCKED";
    case SQLITE_NOMEM:
      return "SQLITE_NOMEM";
    case SQLITE_READONLY:
      return "SQLITE_READONLY";
    case SQLITE_IOERR:
      return "SQLITE_IOERR";
    case SQLITE_CORRUPT:
      return "SQLITE_CORRUPT";
    case SQLITE_FULL:
      return "SQLITE_FULL";
    case SQLITE_CANTOPEN:
      return "SQLITE_CANTOPEN";
    case SQLITE_PROTOCOL:
      return "SQLITE_PROTOCOL";
    case SQLITE_SCHEMA:
      return "SQLITE_SCHEMA";
    case SQLITE_TOOBIG:
      return "SQLITE_TOOBIG";
    case SQLITE_CONSTRAINT:
      return "SQLITE_CONSTRAINT";
    case SQLITE_MISMATCH:
      return "SQLITE_MISMATCH";
    case SQLITE_MISUSE:
      return "SQLITE_MISUSE";
    case SQLITE_RANGE:
      return "SQLITE_RANGE";
    case SQLITE_NOTADB:
      return "SQLITE_NOTADB";
    default:
      return "SQLITE";
  }
}

absl::StatusCode CodeOf(int rc) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
    case SQLITE_TOOBIG:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_CONSTRAINT:
      return absl::StatusCode::kAlreadyExists;
    case SQLITE_RANGE:
    case SQLITE_MISUSE:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

// --- SqliteStatement ---

SqliteStatement::~SqliteStatement() { sqlite3_finalize(stmt_); }

void SqliteStatement::Reset(std::string purpose) {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  purpose_ = std::move(purpose);
  bind_error_ = SQLITE_OK;
  done_ = false;
}

void SqliteStatement::CheckBind(int rc) {
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
}

SqliteStatement& SqliteStatement::Bind(int index, int64_t value) {
  CheckBind(sqlite3_bind_int64(stmt_, index, value));
  return *this;
}

SqliteStatement& SqliteStatement::Bind(int index, double value) {
  CheckBind(sqlite3_bind_double(stmt_, index, value));
  return *this;
}

SqliteStatement& SqliteStatement::BindText(int index, absl::string_view text) {
  CheckBind(
      sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}

SqliteStatement& SqliteStatement::BindBlob(int index, absl::string_view bytes) {
  // A zero-length blob still binds a blob, not NULL (sqlite3_bind_blob64 with a null pointer
  // would bind NULL).
  static const char kEmpty = 0;
  CheckBind(sqlite3_bind_blob64(stmt_, index, bytes.empty() ? &kEmpty : bytes.data(), bytes.size(),
                                SQLITE_TRANSIENT));
  return *this;
}

SqliteStatement& SqliteStatement::BindNull(int index) {
  CheckBind(sqlite3_bind_null(stmt_, index));
  return *this;
}

absl::StatusOr<bool> SqliteStatement::Next() {
  if (bind_error_ != SQLITE_OK) return db_->Error(bind_error_, purpose_);
  if (done_) return false;
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  done_ = true;
  // Reset at once: a finished statement must not keep a read transaction open.
  sqlite3_reset(stmt_);
  if (rc == SQLITE_DONE) return false;
  return db_->Error(rc, purpose_);
}

absl::Status SqliteStatement::ForEachRow(const std::function<void(const SqliteStatement&)>& row) {
  while (true) {
    ASSIGN_OR_RETURN(bool more, Next());
    if (!more) return absl::OkStatus();
    row(*this);
  }
}

absl::Status SqliteStatement::Run() {
  while (true) {
    ASSIGN_OR_RETURN(bool row, Next());
    if (!row) return absl::OkStatus();
  }
}

int64_t SqliteStatement::ColumnInt(int column) const { return sqlite3_column_int64(stmt_, column); }

double SqliteStatement::ColumnDouble(int column) const {
  return sqlite3_column_double(stmt_, column);
}

std::string SqliteStatement::ColumnText(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  const int size = sqlite3_column_bytes(stmt_, column);
  return text == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(text), size);
}

std::string SqliteStatement::ColumnBlob(int column) const {
  const void* data = sqlite3_column_blob(stmt_, column);
  const int size = sqlite3_column_bytes(stmt_, column);
  return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), size);
}

bool SqliteStatement::ColumnIsNull(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

// --- SqliteDb ---

absl::StatusOr<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::string& path,
                                                         absl::Duration busy_timeout) {
  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close(raw);
    return absl::Status(
        CodeOf(rc) == absl::StatusCode::kInternal ? absl::StatusCode::kFailedPrecondition
                                                  : CodeOf(rc),
        absl::StrCat(path, ": opening the database: ", message, " (", CodeName(rc), ")"));
  }
  std::unique_ptr<SqliteDb> db(new SqliteDb(path, raw));
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, static_cast<int>(absl::ToInt64Milliseconds(busy_timeout)));
  // journal_mode answers with the mode it is in: anything but "wal" means it could not be set.
  ASSIGN_OR_RETURN(SqliteStatement * mode,
                   db->Prepare("PRAGMA journal_mode=WAL", "setting WAL mode"));
  ASSIGN_OR_RETURN(bool row, mode->Next());
  const std::string got = row ? mode->ColumnText(0) : "";
  RETURN_IF_ERROR(mode->Run());
  if (got != "wal") {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": cannot use WAL mode (the journal mode is '", got,
        "'); the data root must be on a local file system that supports shared memory"));
  }
  RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON", "enabling foreign keys"));
  RETURN_IF_ERROR(db->SetSync(Sync::kNormal));
  return db;
}

SqliteDb::~SqliteDb() {
  statements_.clear();  // finalize before closing
  if (const int rc = sqlite3_close(db_); rc != SQLITE_OK) {
    spdlog::warn("{}: closing: {}", path_, sqlite3_errstr(rc));
  }
}

absl::Status SqliteDb::Error(int rc, absl::string_view purpose) const {
  const int code = sqlite3_extended_errcode(db_);
  // The connection's message describes its latest error; fall back to the code's text when
  // the error did not come from the connection (a bind error, say).
  std::string message = (code & 0xff) == (rc & 0xff) ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  return absl::Status(CodeOf(rc), absl::StrCat(path_, ": ", purpose, ": ", message, " (",
                                               CodeName(rc), ", code ", rc, ")"));
}

absl::Status SqliteDb::Exec(absl::string_view sql, absl::string_view purpose) {
  const std::string text(sql);
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return absl::OkStatus();
  std::string detail = message != nullptr ? message : sqlite3_errstr(rc);
  sqlite3_free(message);
  return absl::Status(CodeOf(rc), absl::StrCat(path_, ": ", purpose, ": ", detail, " (",
                                               CodeName(rc), ", code ", rc, ")"));
}

absl::StatusOr<SqliteStatement*> SqliteDb::Prepare(absl::string_view sql,
                                                   absl::string_view purpose) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                      SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      return Error(rc, absl::StrCat(purpose, " (preparing '", sql, "')"));
    }
    it = statements_
             .emplace(std::string(sql),
                      std::unique_ptr<SqliteStatement>(new SqliteStatement(this, stmt)))
             .first;
  }
  it->second->Reset(std::string(purpose));
  return it->second.get();
}

absl::Status SqliteDb::SetSync(Sync sync) {
  RETURN_IF_ERROR(
      Exec(sync == Sync::kFull ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
           "setting PRAGMA synchronous"));
  sync_ = sync;
  return absl::OkStatus();
}

absl::StatusOr<SqliteDb::Transaction> SqliteDb::Begin(Sync sync, absl::string_view purpose) {
  // The setting applies to the commits that follow; it is set outside any transaction.
  if (sync != sync_) {
    RETURN_IF_ERROR(SetSync(sync));
  }
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", purpose));
  return Transaction(this, std::string(purpose));
}

SqliteDb::Transaction::~Transaction() {
  if (db_ == nullptr) return;
  if (absl::Status s = db_->Exec("ROLLBACK", purpose_); !s.ok()) {
    spdlog::warn("{}", s.ToString());
  }
}

absl::Status SqliteDb::Transaction::Commit() {
  if (db_ == nullptr) return absl::FailedPreconditionError("transaction already finished");
  SqliteDb* db = db_;
  absl::Status s = db->Exec("COMMIT", purpose_);
  if (!s.ok()) {
    // A failed COMMIT may leave the transaction open (SQLITE_BUSY) or rolled back (I/O
    // error); roll back whatever is left so the connection is usable again.
    if (sqlite3_get_autocommit(db->db_) == 0) (void)db->Exec("ROLLBACK", purpose_);
  }
  db_ = nullptr;
  return s;
}

absl::StatusOr<int> SqliteDb::UserVersion() {
  ASSIGN_OR_RETURN(SqliteStatement * st,
                   Prepare("PRAGMA user_version", "reading the schema version"));
  ASSIGN_OR_RETURN(bool row, st->Next());
  const int version = row ? static_cast<int>(st->ColumnInt(0)) : 0;
  RETURN_IF_ERROR(st->Run());
  return version;
}

absl::StatusOr<int> SqliteDb::Migrate(const std::vector<std::string>& migrations) {
  ASSIGN_OR_RETURN(int found, UserVersion());
  const int known = static_cast<int>(migrations.size());
  if (found > known) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": the schema is at version ", found,
                                                      " but this build knows only up to ", known,
                                                      ": it was written by a newer coordinator"));
  }
  for (int v = found; v < known; ++v) {
    const std::string purpose = absl::StrCat("migrating the schema to version ", v + 1);
    ASSIGN_OR_RETURN(Transaction txn, Begin(Sync::kFull, purpose));
    RETURN_IF_ERROR(Exec(migrations[v], purpose));
    RETURN_IF_ERROR(Exec(absl::StrCat("PRAGMA user_version=", v + 1), purpose));
    RETURN_IF_ERROR(txn.Commit());
  }
  return found;
}

}  // namespace tandem::coordinator
