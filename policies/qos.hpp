// QoS ordering of queued jobs: strict priority between class ranks, weighted fair queuing between
// classes of one rank and between tenants inside a class, bounded queues, deadline expiry.
// A plain value type: no clock, no actors; the router owns one and passes `now` in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sy::policy {

/// A priority class as configured.
struct PriorityClass {
  std::string name;
  int rank = 0;                       ///< lower ranks are served first, strictly
  double weight = 1.0;                ///< share among classes of the same rank (> 0)
  std::size_t queue_limit = 1024;     ///< queued jobs at most; push beyond answers `full`
  std::int64_t queue_timeout_ms = 0;  ///< longest wait in the queue; 0: none
};

/// The priority classes used when the configuration names none. Interactive work overtakes batch
/// work strictly (rank 0 before rank 1). Interactive queues are short so that an overloaded server
/// says so quickly; batch queues are deep because offline clients keep a window of jobs in flight
/// and would rather wait than retry.
std::vector<PriorityClass> default_classes();

/// A job as the queue sees it: a handle to the router's record and what ordering needs.
struct QueuedJob {
  std::uint64_t handle = 0;  ///< unique among queued jobs
  std::string tenant;
  double tenant_weight = 1.0;    ///< the tenant's share inside a class (> 0)
  std::uint32_t cost = 1;        ///< expected tokens (prompt + max_tokens): what fairness counts
  std::int64_t enqueued_ms = 0;  ///< when it was queued (for the class queue timeout)
  std::int64_t deadline_ms = 0;  ///< absolute time after which it must not start; 0: none
};

/// Outcome of FairQueue::push.
enum class PushResult { accepted, full, unknown_class, duplicate };

/// A job leaving the queue for execution.
struct Dequeued {
  QueuedJob job;
  std::size_t class_index = 0;
};

/// Why a job left the queue without running.
enum class ExpiryReason { deadline, queue_timeout };

/// A job whose deadline or class queue timeout passed while it waited.
struct Expired {
  QueuedJob job;
  std::size_t class_index = 0;
  ExpiryReason reason = ExpiryReason::deadline;
};

/// The router's queues. Selection (pop):
///  1. the lowest rank that has a queued job wins outright (strict priority);
///  2. among classes of that rank, weighted fair queuing by class weight;
///  3. inside the class, weighted fair queuing by tenant weight, FIFO within a tenant.
/// Fair queuing uses virtual finish tags: a job that becomes its flow's head gets
/// start = max(virtual time, flow's last finish), finish = start + cost / weight, and the smallest
/// finish tag goes first (ties: earlier arrival). An idle flow re-enters at the current virtual
/// time, so it cannot bank credit while idle. All operations are O(log n) except removing a job
/// from the middle of one tenant's queue (linear in that tenant's queued jobs).
class FairQueue {
 public:
  /// Throws std::invalid_argument when the classes are empty, names repeat or are empty,
  /// a weight is not positive or a queue limit is 0.
  explicit FairQueue(std::vector<PriorityClass> classes);
  FairQueue(const FairQueue&) = delete;  // flows are linked by pointer inside
  FairQueue& operator=(const FairQueue&) = delete;
  FairQueue(FairQueue&&) = default;
  FairQueue& operator=(FairQueue&&) = default;

  /// The index of a class by name.
  std::optional<std::size_t> find_class(std::string_view name) const;
  /// Queues a job; `full` when the class is at its queue limit (nothing changes then).
  PushResult push(std::size_t class_index, QueuedJob job);
  /// Takes the next job to run, or nullopt when all queues are empty.
  std::optional<Dequeued> pop();
  /// The rank of the class pop() would serve now (the lowest with a queued job); nullopt when
  /// every queue is empty.
  std::optional<int> next_rank() const;
  /// The most important rank of the configured classes (the lowest number).
  int top_rank() const;
  /// Removes a queued job (cancellation); false when it is not queued.
  bool remove(std::uint64_t handle);
  /// Removes and returns every job whose deadline or class queue timeout is at or before now_ms,
  /// earliest first. Expired jobs must never run, so the router sweeps before each dispatch.
  std::vector<Expired> expire(std::int64_t now_ms);
  /// The earliest expiry among queued jobs (for the router's next sweep timer).
  std::optional<std::int64_t> next_expiry() const;

  bool contains(std::uint64_t handle) const { return where_.count(handle) != 0; }
  std::size_t size() const { return total_; }
  bool empty() const { return total_ == 0; }
  std::size_t size(std::size_t class_index) const { return classes_.at(class_index).size; }
  /// Tenants the class holds state for: those with queued jobs, and empty flows whose last tag
  /// is still ahead of virtual time (at most 4,096 of those: see retire_flow).
  std::size_t flows(std::size_t class_index) const { return classes_.at(class_index).flows.size(); }
  bool full(std::size_t class_index) const;
  /// Jobs that would be served before a job pushed now into the class: an estimate, since fair
  /// queuing may let a later job of a lighter tenant overtake (all of lower rank + its own class).
  std::size_t position_estimate(std::size_t class_index) const;
  /// Jobs that pop() would hand out before the queued job `handle` were nothing more pushed or
  /// removed: every job of a more important rank, and those of its own rank that the fair
  /// queuing tags put ahead of it (a replay of pop() on the tags as they stand, O(n log n) in
  /// the jobs of that rank). nullopt when it is not queued. A job pushed later can still
  /// overtake it (a more important class, or a tenant with less recent service).
  std::optional<std::size_t> ahead_of(std::uint64_t handle) const;
  const PriorityClass& config(std::size_t class_index) const {
    return classes_.at(class_index).cfg;
  }
  std::size_t class_count() const { return classes_.size(); }

 private:
  struct Flow;
  struct Tag {
    double finish;
    std::uint64_t arrival;  // tie-break: FIFO
    Flow* flow;
    bool operator<(const Tag& o) const {
      if (finish != o.finish) return finish < o.finish;
      return arrival < o.arrival;
    }
  };
  struct Entry {
    QueuedJob job;
    std::uint64_t arrival;
  };
  struct Flow {  // one tenant inside one class
    std::deque<Entry> jobs;
    double weight = 1.0;
    double last_finish = 0;
    Tag head{};  // valid while jobs is not empty
    double head_start = 0;
  };
  struct ClassState {
    PriorityClass cfg;
    std::unordered_map<std::string, Flow> flows;
    std::deque<std::string> empty_flows;  // flows kept empty for their tags, oldest first
    std::set<Tag> ready;                  // one tag per non-empty flow
    double vtime = 0;                     // tenant-level virtual time
    double last_finish = 0;  // class-level finish tag of its last service, among its rank
    double start = 0;        // class-level start tag, fixed while the class stays backlogged
    std::size_t size = 0;
  };
  struct Where {
    std::size_t class_index;
    std::int64_t expiry;  // INT64_MAX: never
    ExpiryReason reason;
    std::string tenant;
  };

  void set_head(ClassState& c, Flow& f);
  QueuedJob take(const Where& at, std::uint64_t handle);
  void retire_flow(ClassState& c, const std::string& tenant);

  std::vector<ClassState> classes_;
  std::vector<std::size_t> by_rank_;  // class indices sorted by (rank, index)
  std::map<int, double> rank_vtime_;  // class-level virtual time per rank
  std::unordered_map<std::uint64_t, Where> where_;
  std::set<std::pair<std::int64_t, std::uint64_t>> expiries_;  // (expiry, handle)
  std::uint64_t arrivals_ = 0;
  std::size_t total_ = 0;
};

}  // namespace sy::policy
