// Tests of the SQLite wrapper and the data root's lock.
#include "coordinator/sqlite_db.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "coordinator/file_lock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;

class SqliteDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/tandem-sqlite-XXXXXX";
    dir_ = mkdtemp(dir_template);
    path_ = dir_ + "/test.db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The single value `sql` answers.
  static std::string One(SqliteDb& db, const std::string& sql) {
    auto st = db.Prepare(sql, "reading one value");
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return "";
    auto row = (*st)->Next();
    EXPECT_TRUE(row.ok() && *row) << sql;
    std::string value = (*st)->ColumnText(0);
    EXPECT_TRUE((*st)->Run().ok());
    return value;
  }

  std::string dir_;
  std::string path_;
};

const std::vector<std::string> kTwoVersions = {
    "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    "ALTER TABLE t ADD COLUMN w REAL;",
};

TEST_F(SqliteDbTest, OpensInWalModeAndMigratesEachVersionOnce) {
  {
    auto db = SqliteDb::Open(path_);
    ASSERT_TRUE(db.ok()) << db.status();
    EXPECT_EQ(One(**db, "PRAGMA journal_mode"), "wal");
    EXPECT_EQ(One(**db, "PRAGMA foreign_keys"), "1");
    auto found = (*db)->Migrate({kTwoVersions[0]});
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(*found, 0);  // a new database
    EXPECT_EQ(*(*db)->UserVersion(), 1);
  }
  auto db = SqliteDb::Open(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  // Only the second migration runs now (the first again would fail: the table exists).
  auto found = (*db)->Migrate(kTwoVersions);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 1);
  EXPECT_EQ(*(*db)->UserVersion(), 2);
  EXPECT_TRUE((*db)->Exec("INSERT INTO t (k, v, w) VALUES (1, 'a', 2.5)", "inserting").ok());
  // A build that knows fewer versions refuses the database rather than misread it.
  auto older = (*db)->Migrate({kTwoVersions[0]});
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(older.status().message(), HasSubstr("newer coordinator"));
  EXPECT_THAT(older.status().message(), HasSubstr(path_));
}

TEST_F(SqliteDbTest, AFailedMigrationLeavesTheVersionAsItWas) {
  auto db = SqliteDb::Open(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  auto found = (*db)->Migrate({kTwoVersions[0], "CREATE TABLE u (x); THIS IS NOT SQL;"});
  EXPECT_FALSE(found.ok());
  EXPECT_THAT(found.status().message(), HasSubstr("migrating the schema to version 2"));
  EXPECT_EQ(*(*db)->UserVersion(), 1);
  // Its first statement was rolled back with it.
  auto st = (*db)->Prepare("SELECT x FROM u", "reading u");
  EXPECT_FALSE(st.ok());
}

TEST_F(SqliteDbTest, StatementsBindAndReadEveryTypeAndAreReused) {
  auto db = SqliteDb::Open(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE(
      (*db)->Exec("CREATE TABLE t (i INTEGER, d REAL, s TEXT, b BLOB, n)", "creating").ok());
  const std::string blob("a\0b\xff", 4);
  const std::string insert = "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)";
  for (int64_t i : {int64_t{1} << 40, int64_t{-7}}) {
    auto st = (*db)->Prepare(insert, "inserting");
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_TRUE((*st)
                    ->Bind(1, i)
                    .Bind(2, 0.25)
                    .BindText(3, "x'y")
                    .BindBlob(4, blob)
                    .BindNull(5)
                    .Run()
                    .ok());
  }
  auto again = (*db)->Prepare(insert, "inserting");
  ASSERT_TRUE(again.ok());
  // An empty blob is a blob, not NULL.
  ASSERT_TRUE(
      (*again)->Bind(1, 0).Bind(2, 0.0).BindText(3, "").BindBlob(4, "").Bind(5, 3).Run().ok());
  auto q = (*db)->Prepare("SELECT i, d, s, b, n, typeof(b) FROM t ORDER BY rowid", "reading");
  ASSERT_TRUE(q.ok());
  std::vector<int64_t> ints;
  std::vector<std::string> types;
  while (true) {
    auto row = (*q)->Next();
    ASSERT_TRUE(row.ok()) << row.status();
    if (!*row) break;
    ints.push_back((*q)->ColumnInt(0));
    types.push_back((*q)->ColumnText(5));
    if (ints.size() == 1) {
      EXPECT_EQ((*q)->ColumnDouble(1), 0.25);
      EXPECT_EQ((*q)->ColumnText(2), "x'y");
      EXPECT_EQ((*q)->ColumnBlob(3), blob);
      EXPECT_TRUE((*q)->ColumnIsNull(4));
    }
  }
  EXPECT_EQ(ints, (std::vector<int64_t>{int64_t{1} << 40, -7, 0}));
  EXPECT_EQ(types, (std::vector<std::string>{"blob", "blob", "blob"}));
  // Past the end it stays at the end.
  EXPECT_FALSE(*(*q)->Next());

  // ForEachRow visits the same rows in order; a statement's error comes back, with no row.
  q = (*db)->Prepare("SELECT i FROM t ORDER BY rowid", "reading");
  ASSERT_TRUE(q.ok());
  std::vector<int64_t> visited;
  ASSERT_TRUE(
      (*q)->ForEachRow([&](const SqliteStatement& r) { visited.push_back(r.ColumnInt(0)); }).ok());
  EXPECT_EQ(visited, ints);
  q = (*db)->Prepare("SELECT i FROM t WHERE i > ?1", "reading with a bad binding");
  ASSERT_TRUE(q.ok());
  absl::Status bad = (*q)->Bind(9, 1).ForEachRow([&](const SqliteStatement&) { ADD_FAILURE(); });
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), HasSubstr("reading with a bad binding"));
}

TEST_F(SqliteDbTest, ATransactionIsRolledBackUnlessCommitted) {
  auto db = SqliteDb::Open(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Exec("CREATE TABLE t (k INTEGER PRIMARY KEY)", "creating").ok());
  {
    auto txn = (*db)->Begin(SqliteDb::Sync::kFull, "adding 1");
    ASSERT_TRUE(txn.ok()) << txn.status();
    ASSERT_TRUE((*db)->Exec("INSERT INTO t VALUES (1)", "adding 1").ok());
    ASSERT_TRUE(txn->Commit().ok());
  }
  {
    auto txn = (*db)->Begin(SqliteDb::Sync::kNormal, "adding 2");
    ASSERT_TRUE(txn.ok()) << txn.status();
    ASSERT_TRUE((*db)->Exec("INSERT INTO t VALUES (2)", "adding 2").ok());
    // Dropped without a commit.
  }
  EXPECT_EQ(One(**db, "SELECT group_concat(k) FROM t"), "1");
  EXPECT_EQ(One(**db, "PRAGMA synchronous"), "1");  // NORMAL, as the last transaction asked
  // A new transaction can begin: the abandoned one left nothing open.
  auto txn = (*db)->Begin(SqliteDb::Sync::kFull, "adding 3");
  ASSERT_TRUE(txn.ok()) << txn.status();
  ASSERT_TRUE((*db)->Exec("INSERT INTO t VALUES (3)", "adding 3").ok());
  ASSERT_TRUE(txn->Commit().ok());
  EXPECT_EQ(One(**db, "PRAGMA synchronous"), "2");  // FULL
  EXPECT_EQ(One(**db, "SELECT group_concat(k) FROM t"), "1,3");
}

TEST_F(SqliteDbTest, ErrorsNameTheFileWhatTheSqlWasForAndTheCode) {
  auto db = SqliteDb::Open(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Exec("CREATE TABLE t (k INTEGER PRIMARY KEY)", "creating").ok());
  absl::Status bad = (*db)->Exec("SELEKT 1", "checking the grammar");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(bad.message(), HasSubstr(path_ + ": checking the grammar: "));
  EXPECT_THAT(bad.message(), HasSubstr("syntax error"));
  EXPECT_THAT(bad.message(), HasSubstr("SQLITE_ERROR"));

  ASSERT_TRUE((*db)->Exec("INSERT INTO t VALUES (1)", "adding").ok());
  auto st = (*db)->Prepare("INSERT INTO t VALUES (?1)", "adding job-1 again");
  ASSERT_TRUE(st.ok());
  absl::Status dup = (*st)->Bind(1, 1).Run();
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(dup.message(), HasSubstr("adding job-1 again: UNIQUE constraint failed"));

  // A parameter index out of range is reported when the statement runs.
  auto range = (*db)->Prepare("INSERT INTO t VALUES (?1)", "binding");
  ASSERT_TRUE(range.ok());
  absl::Status s = (*range)->Bind(1, 5).Bind(2, 6).Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("binding"));
  EXPECT_THAT(s.message(), HasSubstr("SQLITE_RANGE"));
  EXPECT_EQ(One(**db, "SELECT count(*) FROM t"), "1");

  auto missing = (*db)->Prepare("SELECT * FROM nowhere", "reading nowhere");
  EXPECT_THAT(missing.status().message(), HasSubstr("no such table: nowhere"));
}

TEST_F(SqliteDbTest, AFileThatIsNotADatabaseIsDataLossNamingIt) {
  std::ofstream(path_) << std::string(4096, 'x');  // not an SQLite header
  auto db = SqliteDb::Open(path_);
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(db.status().message(), HasSubstr(path_));
  auto nowhere = SqliteDb::Open(dir_ + "/no/such/dir/x.db");
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(nowhere.status().message(), HasSubstr("/no/such/dir/x.db: opening the database"));
}

TEST_F(SqliteDbTest, AFileLockIsExclusiveAndNamesItsHolder) {
  const std::string path = dir_ + "/x.lock";
  auto first = FileLock::Acquire(path, "the data root /d");
  ASSERT_TRUE(first.ok()) << first.status();
  // Another open file of the same process conflicts too, as another process's would.
  auto second = FileLock::Acquire(path, "the data root /d");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("the data root /d is in use by another coordinator (", path,
                                     " is locked by process ", getpid(), ")")));
  first->reset();
  EXPECT_TRUE(FileLock::Acquire(path, "the data root /d").ok());
}

}  // namespace
}  // namespace tandem::coordinator
