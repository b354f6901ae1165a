// FairQueue: strict priority by rank, weighted fair queuing by class and tenant weight, expiry.
#include "policies/qos.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <unordered_set>

namespace sy::policy {

namespace {
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();
}

std::vector<PriorityClass> default_classes() {
  return {{"interactive", 0, 1.0, 256, 0}, {"batch", 1, 1.0, 4096, 0}};
}

FairQueue::FairQueue(std::vector<PriorityClass> classes) {
  if (classes.empty()) throw std::invalid_argument("FairQueue: no priority classes");
  std::unordered_set<std::string> names;
  for (auto& c : classes) {
    if (c.name.empty()) throw std::invalid_argument("FairQueue: a priority class has no name");
    if (!names.insert(c.name).second)
      throw std::invalid_argument("FairQueue: priority class '" + c.name + "' repeats");
    if (!(c.weight > 0))
      throw std::invalid_argument("FairQueue: class '" + c.name + "' weight must be > 0");
    if (c.queue_limit == 0)
      throw std::invalid_argument("FairQueue: class '" + c.name + "' queue_limit must be > 0");
    if (c.queue_timeout_ms < 0)
      throw std::invalid_argument("FairQueue: class '" + c.name + "' queue_timeout_ms < 0");
    ClassState s;
    s.cfg = std::move(c);
    classes_.push_back(std::move(s));
  }
  for (std::size_t i = 0; i < classes_.size(); ++i) by_rank_.push_back(i);
  std::stable_sort(by_rank_.begin(), by_rank_.end(), [&](std::size_t a, std::size_t b) {
    return classes_[a].cfg.rank < classes_[b].cfg.rank;
  });
}

std::optional<std::size_t> FairQueue::find_class(std::string_view name) const {
  for (std::size_t i = 0; i < classes_.size(); ++i)
    if (classes_[i].cfg.name == name) return i;
  return std::nullopt;
}

bool FairQueue::full(std::size_t class_index) const {
  const ClassState& c = classes_.at(class_index);
  return c.size >= c.cfg.queue_limit;
}

std::size_t FairQueue::position_estimate(std::size_t class_index) const {
  const ClassState& mine = classes_.at(class_index);
  std::size_t n = 0;
  for (const ClassState& c : classes_)
    if (c.cfg.rank < mine.cfg.rank) n += c.size;
  return n + mine.size;
}

std::optional<std::size_t> FairQueue::ahead_of(std::uint64_t handle) const {
  const auto w = where_.find(handle);
  if (w == where_.end()) return std::nullopt;
  const int rank = classes_[w->second.class_index].cfg.rank;
  std::size_t ahead = 0;
  for (const ClassState& c : classes_)
    if (c.cfg.rank < rank) ahead += c.size;  // strict priority: all of them go first

  // The same steps as pop() and set_head(), on copies of the tags of this rank's classes.
  struct SimFlow {
    const std::deque<Entry>* jobs;
    std::size_t next = 0;  // index of its head in *jobs
    double weight, last_finish, head_start;
  };
  using SimTag = std::tuple<double, std::uint64_t, std::size_t>;  // finish, arrival, flow
  struct SimClass {
    const ClassState* c;
    double vtime, last_finish, start;
    std::size_t size;
    std::vector<SimFlow> flows;
    std::set<SimTag> ready;
  };
  std::vector<SimClass> sim;
  for (std::size_t i : by_rank_) {
    const ClassState& c = classes_[i];
    if (c.cfg.rank != rank || c.size == 0) continue;
    SimClass sc{&c, c.vtime, c.last_finish, c.start, c.size, {}, {}};
    for (const auto& [tenant, f] : c.flows) {
      if (f.jobs.empty()) continue;
      sc.ready.emplace(f.head.finish, f.head.arrival, sc.flows.size());
      sc.flows.push_back(SimFlow{&f.jobs, 0, f.weight, f.last_finish, f.head_start});
    }
    sim.push_back(std::move(sc));
  }
  const auto rv = rank_vtime_.find(rank);
  double rank_vtime = rv == rank_vtime_.end() ? 0.0 : rv->second;
  for (;;) {
    SimClass* best = nullptr;
    double best_finish = 0, best_start = 0;
    for (SimClass& sc : sim) {
      if (sc.size == 0) continue;
      const SimFlow& head = sc.flows[std::get<2>(*sc.ready.begin())];
      const double finish =
          sc.start + static_cast<double>((*head.jobs)[head.next].job.cost) / sc.c->cfg.weight;
      if (!best || finish < best_finish) {
        best = &sc;
        best_finish = finish;
        best_start = sc.start;
      }
    }
    if (!best) return ahead;  // unreachable: the job is queued at this rank
    rank_vtime = std::max(rank_vtime, best_start);
    best->last_finish = best_finish;
    const SimTag tag = *best->ready.begin();
    best->ready.erase(best->ready.begin());
    SimFlow& f = best->flows[std::get<2>(tag)];
    best->vtime = std::max(best->vtime, f.head_start);
    f.last_finish = std::get<0>(tag);
    if ((*f.jobs)[f.next].job.handle == handle) return ahead;
    ++ahead;
    if (++f.next < f.jobs->size()) {
      const Entry& e = (*f.jobs)[f.next];
      f.head_start = std::max(best->vtime, f.last_finish);
      best->ready.emplace(f.head_start + static_cast<double>(e.job.cost) / f.weight, e.arrival,
                          std::get<2>(tag));
    }
    if (--best->size > 0) best->start = std::max(rank_vtime, best->last_finish);
  }
}

void FairQueue::set_head(ClassState& c, Flow& f) {
  const Entry& e = f.jobs.front();
  f.head_start = std::max(c.vtime, f.last_finish);
  f.head = Tag{f.head_start + static_cast<double>(e.job.cost) / f.weight, e.arrival, &f};
  c.ready.insert(f.head);
}

void FairQueue::retire_flow(ClassState& c, const std::string& tenant) {
  // An empty flow whose last tag is not ahead of virtual time carries no state that matters
  // (it would re-enter at vtime anyway): drop it so idle tenants cost no memory.
  auto it = c.flows.find(tenant);
  if (it == c.flows.end() || !it->second.jobs.empty()) return;
  if (it->second.last_finish <= c.vtime) {
    c.flows.erase(it);
    return;
  }
  // Ahead of virtual time, its tag still holds back a tenant that was just served. Virtual time
  // need not pass it soon (it stands still while only new tenants arrive), so beyond
  // kMaxEmptyFlows such flows the oldest are dropped: a tenant returning after that many others
  // loses at most one job's lag, while endless new tenant names cannot grow the queue's memory.
  constexpr std::size_t kMaxEmptyFlows = 4096;
  c.empty_flows.push_back(tenant);
  while (c.empty_flows.size() > kMaxEmptyFlows) {
    auto old = c.flows.find(c.empty_flows.front());
    if (old != c.flows.end() && old->second.jobs.empty()) c.flows.erase(old);
    c.empty_flows.pop_front();
  }
}

PushResult FairQueue::push(std::size_t class_index, QueuedJob job) {
  if (class_index >= classes_.size()) return PushResult::unknown_class;
  if (where_.count(job.handle)) return PushResult::duplicate;
  ClassState& c = classes_[class_index];
  if (c.size >= c.cfg.queue_limit) return PushResult::full;
  if (!(job.tenant_weight > 0)) job.tenant_weight = 1.0;
  if (job.cost == 0) job.cost = 1;  // a free job would make its tenant's tags stand still

  std::int64_t expiry = kNever;
  ExpiryReason reason = ExpiryReason::deadline;
  if (job.deadline_ms > 0) expiry = job.deadline_ms;
  if (c.cfg.queue_timeout_ms > 0 && job.enqueued_ms + c.cfg.queue_timeout_ms < expiry) {
    expiry = job.enqueued_ms + c.cfg.queue_timeout_ms;
    reason = ExpiryReason::queue_timeout;
  }
  where_.emplace(job.handle, Where{class_index, expiry, reason, job.tenant});
  if (expiry != kNever) expiries_.emplace(expiry, job.handle);

  if (c.size == 0) c.start = std::max(rank_vtime_[c.cfg.rank], c.last_finish);
  Flow& f = c.flows[job.tenant];
  f.weight = job.tenant_weight;
  f.jobs.push_back(Entry{std::move(job), arrivals_++});
  if (f.jobs.size() == 1) set_head(c, f);
  ++c.size;
  ++total_;
  return PushResult::accepted;
}

std::optional<int> FairQueue::next_rank() const {
  if (total_ == 0) return std::nullopt;
  for (std::size_t i : by_rank_)
    if (classes_[i].size > 0) return classes_[i].cfg.rank;
  return std::nullopt;
}

int FairQueue::top_rank() const {
  return by_rank_.empty() ? 0 : classes_[by_rank_.front()].cfg.rank;
}

std::optional<Dequeued> FairQueue::pop() {
  if (total_ == 0) return std::nullopt;
  // The lowest non-empty rank; within it the class with the smallest class-level finish tag.
  std::size_t best = classes_.size();
  double best_finish = 0, best_start = 0;
  int rank = 0;
  for (std::size_t i : by_rank_) {
    const ClassState& c = classes_[i];
    if (c.size == 0) continue;
    if (best != classes_.size() && c.cfg.rank != rank) break;
    rank = c.cfg.rank;
    const double start = c.start;
    const double finish =
        start + static_cast<double>(c.ready.begin()->flow->jobs.front().job.cost) / c.cfg.weight;
    if (best == classes_.size() || finish < best_finish) {
      best = i;
      best_finish = finish;
      best_start = start;
    }
  }
  ClassState& c = classes_[best];
  rank_vtime_[rank] = std::max(rank_vtime_[rank], best_start);
  c.last_finish = best_finish;

  const Tag tag = *c.ready.begin();
  c.ready.erase(c.ready.begin());
  Flow& f = *tag.flow;
  c.vtime = std::max(c.vtime, f.head_start);
  f.last_finish = tag.finish;
  Dequeued out{std::move(f.jobs.front().job), best};
  f.jobs.pop_front();
  if (!f.jobs.empty()) set_head(c, f);
  --c.size;
  --total_;
  if (c.size > 0) c.start = std::max(rank_vtime_[rank], c.last_finish);
  const auto w = where_.find(out.job.handle);
  if (w->second.expiry != kNever) expiries_.erase({w->second.expiry, out.job.handle});
  where_.erase(w);
  if (f.jobs.empty()) retire_flow(c, out.job.tenant);
  return out;
}

QueuedJob FairQueue::take(const Where& at, std::uint64_t handle) {
  ClassState& c = classes_[at.class_index];
  Flow& f = c.flows.at(at.tenant);
  auto it = std::find_if(f.jobs.begin(), f.jobs.end(),
                         [&](const Entry& e) { return e.job.handle == handle; });
  QueuedJob job = std::move(it->job);
  const bool was_head = it == f.jobs.begin();
  if (was_head) c.ready.erase(f.head);
  f.jobs.erase(it);
  // The flow was not served, so its last finish stays: the next head starts where this one did.
  if (was_head && !f.jobs.empty()) set_head(c, f);
  --c.size;
  --total_;
  if (f.jobs.empty()) retire_flow(c, at.tenant);
  return job;
}

bool FairQueue::remove(std::uint64_t handle) {
  const auto w = where_.find(handle);
  if (w == where_.end()) return false;
  const Where at = std::move(w->second);
  where_.erase(w);
  if (at.expiry != kNever) expiries_.erase({at.expiry, handle});
  take(at, handle);
  return true;
}

std::vector<Expired> FairQueue::expire(std::int64_t now_ms) {
  std::vector<Expired> out;
  while (!expiries_.empty() && expiries_.begin()->first <= now_ms) {
    const std::uint64_t handle = expiries_.begin()->second;
    expiries_.erase(expiries_.begin());
    const auto w = where_.find(handle);
    const Where at = std::move(w->second);
    where_.erase(w);
    out.push_back(Expired{take(at, handle), at.class_index, at.reason});
  }
  return out;
}

std::optional<std::int64_t> FairQueue::next_expiry() const {
  if (expiries_.empty()) return std::nullopt;
  return expiries_.begin()->first;
}

}  // namespace sy::policy
