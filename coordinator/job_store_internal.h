// Helpers shared by job_store.cc and job_store_recovery.cc (the two halves of JobStore); not
// for use outside them.
#ifndef TANDEM_COORDINATOR_JOB_STORE_INTERNAL_H_
#define TANDEM_COORDINATOR_JOB_STORE_INTERNAL_H_

#include <cstdint>
#include <deque>
#include <string>

#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator::job_store_internal {

// Wall-clock milliseconds since the Unix epoch (the database's timestamps).
int64_t NowMs();

// Parses "job-N" into N; false for any other string.
bool ParseJobId(const std::string& id, int64_t* n);

// Stage files a checkpoint of the job has: one per worker rank.
int NumRanks(const v1::Job& job);

// Drops the steps from `first` on from the history (they are to be run again) and refreshes
// the job's latest losses; returns how many went.
int64_t DropStepsFrom(v1::Job& job, std::deque<v1::StepSummary>& history, int64_t first);

}  // namespace tandem::coordinator::job_store_internal

#endif  // TANDEM_COORDINATOR_JOB_STORE_INTERNAL_H_
