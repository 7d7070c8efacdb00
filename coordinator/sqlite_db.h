// A small wrapper of one SQLite connection (the system libsqlite3): opened in WAL mode,
// prepared statements cached by their SQL, transactions as scoped objects, the schema
// versioned through PRAGMA user_version, and every error an absl::Status that names the
// database file and what the SQL was for ("/data/coordinator.db: recording step 7 of job-3:
// disk I/O error (SQLITE_IOERR_WRITE)").
//
// Not thread-safe: one owner calls it, under its own lock (JobStore does). The connection is
// opened SQLITE_OPEN_NOMUTEX for that reason.
//
// Durability. In WAL mode a commit appends its pages to <db>-wal; the database file is
// updated later, at a WAL checkpoint. `Sync` picks, per transaction, what a commit survives:
//   kNormal (PRAGMA synchronous=NORMAL): the WAL is written, not fsynced, before the commit
//     returns. The commit survives the process being killed (SIGKILL, a crash: the data are in
//     the kernel's page cache) but an OS crash or a power cut may roll back the latest
//     commits. The database is never corrupted either way: it comes back as of a prefix of the
//     commits.
//   kFull (synchronous=FULL): the WAL is also fsynced before the commit returns (~1-2 ms on
//     the disks here): the commit survives a power cut too.
// Since the WAL is one sequential file, a kFull commit also makes every commit before it
// durable, so what survives a power cut is always a prefix of the commit order. JobStore uses
// kFull for what must never be taken back (a submission, a state change, a checkpoint record)
// and kNormal for the per-step rows, whose loss to a power cut costs only a rerun of steps
// after the last checkpoint.
#ifndef TANDEM_COORDINATOR_SQLITE_DB_H_
#define TANDEM_COORDINATOR_SQLITE_DB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tandem::coordinator {

class SqliteDb;

// A prepared statement, owned (and cached) by its SqliteDb. Get it from SqliteDb::Prepare
// for each use: that resets it and clears its bindings. Bind parameters by 1-based index,
// then Run() (no rows expected) or Next() until it returns false; columns are 0-based.
class SqliteStatement {
 public:
  ~SqliteStatement();
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;

  SqliteStatement& Bind(int index, int64_t value);
  SqliteStatement& Bind(int index, int value) { return Bind(index, static_cast<int64_t>(value)); }
  SqliteStatement& Bind(int index, double value);
  SqliteStatement& BindText(int index, absl::string_view text);
  SqliteStatement& BindBlob(int index, absl::string_view bytes);
  SqliteStatement& BindNull(int index);

  // Steps to the end, ignoring any rows.
  absl::Status Run();
  // Steps to the next row: true while there is one, false at the end.
  absl::StatusOr<bool> Next();
  // Steps through every row, calling `row` with the statement on it (read its columns).
  absl::Status ForEachRow(const std::function<void(const SqliteStatement&)>& row);

  int64_t ColumnInt(int column) const;
  double ColumnDouble(int column) const;
  std::string ColumnText(int column) const;
  std::string ColumnBlob(int column) const;
  bool ColumnIsNull(int column) const;

 private:
  friend class SqliteDb;
  SqliteStatement(SqliteDb* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  void Reset(std::string purpose);
  // A bind error is a programmer's error (index out of range); it is kept and reported by
  // the next Run or Next.
  void CheckBind(int rc);

  SqliteDb* const db_;
  sqlite3_stmt* const stmt_;
  std::string purpose_;
  int bind_error_ = 0;
  bool done_ = false;
};

class SqliteDb {
 public:
  enum class Sync { kNormal, kFull };

  // Opens (creating if needed) the database at `path` in WAL mode, with foreign keys on and
  // `busy_timeout` for locks another connection holds. FAILED_PRECONDITION if it cannot be
  // opened or WAL mode cannot be set (e.g. a file system without shared memory); DATA_LOSS if
  // the file is not a database.
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(
      const std::string& path, absl::Duration busy_timeout = absl::Seconds(5));
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  const std::string& path() const { return path_; }

  // Runs SQL without parameters (several statements allowed); rows are ignored.
  absl::Status Exec(absl::string_view sql, absl::string_view purpose);
  // The statement for `sql`, prepared on first use and then reused; reset, bindings cleared,
  // errors to be reported as `purpose`. Valid until the database is closed.
  absl::StatusOr<SqliteStatement*> Prepare(absl::string_view sql, absl::string_view purpose);

  // A transaction, begun IMMEDIATE (it takes the write lock at once, so it never fails half
  // way for a lock). Rolled back on destruction unless committed.
  class Transaction {
   public:
    Transaction(Transaction&& other) noexcept
        : db_(other.db_), purpose_(std::move(other.purpose_)) {
      other.db_ = nullptr;
    }
    Transaction& operator=(Transaction&&) = delete;
    ~Transaction();
    // Commits; on failure the transaction is rolled back and the error returned.
    absl::Status Commit();

   private:
    friend class SqliteDb;
    Transaction(SqliteDb* db, std::string purpose) : db_(db), purpose_(std::move(purpose)) {}
    SqliteDb* db_;
    std::string purpose_;
  };
  absl::StatusOr<Transaction> Begin(Sync sync, absl::string_view purpose);

  // Schema versioning: migrations[i] takes the schema from version i to i + 1. Those not yet
  // applied (PRAGMA user_version says which are) run in order, each in its own transaction
  // with the new version, so that a crash leaves the schema at one version or the next.
  // FAILED_PRECONDITION if the database is newer than every migration (written by a newer
  // build). Returns the version found before migrating (0: a new database).
  absl::StatusOr<int> Migrate(const std::vector<std::string>& migrations);
  absl::StatusOr<int> UserVersion();

  // The status for SQLite result code `rc` of the latest call, naming the file and `purpose`.
  absl::Status Error(int rc, absl::string_view purpose) const;

 private:
  SqliteDb(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  absl::Status SetSync(Sync sync);

  const std::string path_;
  sqlite3* const db_;
  Sync sync_ = Sync::kFull;  // what PRAGMA synchronous was last set to
  std::map<std::string, std::unique_ptr<SqliteStatement>, std::less<>> statements_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_SQLITE_DB_H_
