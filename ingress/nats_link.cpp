// The NATS JetStream link over libnats: the contract's streams and consumers, fetch, acks,
// publishes and the reconnect counters (see nats_link.hpp and docs/cluster.md).
#include "ingress/nats_link.hpp"

#include <nats/nats.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

namespace sy::cluster {
namespace {

// JetStream durations are in nanoseconds.
constexpr int64_t kNsPerMs = 1000000;
// How long a JetStream request (stream or consumer info, a publish acknowledgement, a
// synchronous ack) may take before it counts as failed: the server answers in well under a
// millisecond on a LAN, and a NATS cluster electing a new leader takes a few seconds.
constexpr int64_t kRequestWaitMs = 5000;
// A fetch waits this much longer than JetStream holds its request open: what JetStream
// delivers up to its expiry (and the status that closes the request) crosses loopback or a LAN
// in well under a millisecond, so a job delivered after its fetch returned is a rare delay.
constexpr int64_t kFetchMarginMs = 10;

std::string text(natsStatus s, jsErrCode code = static_cast<jsErrCode>(0)) {
  std::string t = natsStatus_GetText(s);
  const char* last = nats_GetLastError(nullptr);
  if (last && *last && t.find(last) == std::string::npos) t += std::string(": ") + last;
  if (code != 0) t += " (JetStream error " + std::to_string(static_cast<int>(code)) + ")";
  return t;
}

void check(natsStatus s, const std::string& what, jsErrCode code = static_cast<jsErrCode>(0)) {
  if (s != NATS_OK) throw NatsError(what + ": " + text(s, code), static_cast<int>(code));
}

std::string durable_name(const std::string& class_name) {
  return "switchyard-" + class_name;
}

std::string header(natsMsg* m, const char* key) {
  const char* v = nullptr;
  if (natsMsgHeader_Get(m, key, &v) == NATS_OK && v) return v;
  return {};
}

template <class T>
void differs(std::vector<std::string>& out, const std::string& what, const char* key, T have,
             T want) {
  if (have != want)
    out.push_back(what + ": " + key + " is " + std::to_string(have) + ", the config says " +
                  std::to_string(want));
}

}  // namespace

std::string jobs_subject(const std::string& class_name) {
  return "switchyard.jobs." + class_name;
}

std::string results_subject(const std::string& tenant) {
  return "switchyard.results." + tenant;
}

std::string job_msg_id(const std::string& tenant, const std::string& id) {
  return tenant + "/" + id;
}

std::string subject_token_problem(const std::string& token) {
  if (token.empty()) return "is empty";
  for (unsigned char c : token) {
    if (c == '.' || c == '*' || c == '>') return std::string("contains '") + char(c) + "'";
    if (c <= ' ' || c == 0x7f) return "contains whitespace or a control character";
  }
  return {};
}

struct NatsLink::Callbacks {
  static void disconnected(natsConnection*, void* self) {
    static_cast<NatsLink*>(self)->disconnects_.fetch_add(1, std::memory_order_relaxed);
  }
  static void reconnected(natsConnection*, void* self) {
    static_cast<NatsLink*>(self)->reconnects_.fetch_add(1, std::memory_order_relaxed);
  }
  // Exponential backoff from reconnect_wait_ms up to reconnect_max_ms: a NATS server that is
  // restarting is found again within a fraction of a second, and one that is down for long costs
  // one attempt every few seconds.
  static int64_t delay(natsConnection*, int attempts, void* self) {
    const auto& c = static_cast<NatsLink*>(self)->cfg_;
    int64_t d = std::max<int64_t>(1, c.reconnect_wait_ms);
    for (int i = 1; i < attempts && d < c.reconnect_max_ms; ++i) d *= 2;
    return std::min(d, std::max<int64_t>(1, c.reconnect_max_ms));
  }
};

NatsLink::NatsLink(const ClusterConfig& cfg, std::vector<std::string> classes,
                   int64_t connect_timeout_ms)
    : cfg_(cfg), classes_(std::move(classes)) {
  if (cfg_.nats.empty()) throw NatsError("cluster: no NATS server URL");
  for (const auto& c : classes_)
    if (auto why = subject_token_problem(c); !why.empty())
      throw NatsError("cluster: priority class '" + c + "' cannot be a subject token: it " + why);
  natsOptions* opts = nullptr;
  check(natsOptions_Create(&opts), "cluster: NATS options");
  std::vector<const char*> urls;
  for (const auto& u : cfg_.nats) urls.push_back(u.c_str());
  natsStatus s = natsOptions_SetServers(opts, urls.data(), static_cast<int>(urls.size()));
  if (s == NATS_OK && !cfg_.node_name.empty())
    s = natsOptions_SetName(opts, cfg_.node_name.c_str());
  // Never give up on a lost connection: the node goes on serving its own endpoints meanwhile.
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, -1);
  if (s == NATS_OK) s = natsOptions_SetCustomReconnectDelay(opts, &Callbacks::delay, this);
  if (s == NATS_OK) s = natsOptions_SetDisconnectedCB(opts, &Callbacks::disconnected, this);
  if (s == NATS_OK) s = natsOptions_SetReconnectedCB(opts, &Callbacks::reconnected, this);
  // Requests made while disconnected fail at once instead of waiting out their timeout.
  if (s == NATS_OK) s = natsOptions_SetFailRequestsOnDisconnect(opts, true);
  if (s != NATS_OK) {
    natsOptions_Destroy(opts);
    check(s, "cluster: NATS options");
  }
  // The first connection is retried until connect_timeout_ms: nodes and the NATS servers are
  // often started together.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(connect_timeout_ms);
  for (;;) {
    s = natsConnection_Connect(&nc_, opts);
    if (s == NATS_OK || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::max<int64_t>(1, cfg_.reconnect_wait_ms)));
  }
  natsOptions_Destroy(opts);
  std::string joined;
  for (const auto& u : cfg_.nats) joined += (joined.empty() ? "" : ",") + u;
  check(s, "cluster: cannot connect to NATS at " + joined);
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = kRequestWaitMs;
  s = natsConnection_JetStream(&js_, nc_, &jo);
  if (s != NATS_OK) {
    natsConnection_Destroy(nc_);
    nc_ = nullptr;
    check(s, "cluster: JetStream context");
  }
}

NatsLink::~NatsLink() {
  // A drained subscription has run its last callback, so its listener can go; a subscription
  // that cannot drain (no connection) is unsubscribed, and no callback runs without a connection.
  // A second bounds the wait for a callback that is running.
  for (auto& l : listeners_)
    if (l->sub) {
      if (natsSubscription_Drain(l->sub) == NATS_OK)
        natsSubscription_WaitForDrainCompletion(l->sub, 1000);
      else
        natsSubscription_Unsubscribe(l->sub);
      natsSubscription_Destroy(l->sub);
    }
  for (auto* sub : subs_)
    if (sub) natsSubscription_Destroy(sub);
  if (js_) jsCtx_Destroy(js_);
  if (nc_) {
    natsConnection_Close(nc_);
    natsConnection_Destroy(nc_);
  }
}

std::vector<std::string> NatsLink::ensure_streams() {
  std::vector<std::string> notes;
  std::vector<std::string> job_subjects;
  for (const auto& c : classes_) job_subjects.push_back(jobs_subject(c));
  const std::vector<std::string> result_subjects = {"switchyard.results.>"};

  auto ensure = [&](const char* name, const std::vector<std::string>& subjects, bool work_queue,
                    int64_t max_msgs, int64_t max_bytes, int64_t max_age_ns) {
    std::vector<const char*> subj;
    for (const auto& x : subjects) subj.push_back(x.c_str());
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = name;
    sc.Subjects = subj.data();
    sc.SubjectsLen = static_cast<int>(subj.size());
    sc.Retention = work_queue ? js_WorkQueuePolicy : js_LimitsPolicy;
    sc.Storage = js_FileStorage;
    sc.Replicas = cfg_.replicas;
    sc.MaxMsgs = max_msgs;
    sc.MaxBytes = max_bytes;
    sc.MaxAge = max_age_ns;
    // Jobs: a full queue refuses new jobs (the producer hears "overloaded"); results: the
    // oldest go first, since a new result must always be stored.
    sc.Discard = work_queue ? js_DiscardNew : js_DiscardOld;
    sc.Duplicates = cfg_.duplicate_window_ms * kNsPerMs;
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetStreamInfo(&si, js_, name, nullptr, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
      jerr = static_cast<jsErrCode>(0);
      s = js_AddStream(&si, js_, &sc, nullptr, &jerr);
      if (s == NATS_OK) {
        jsStreamInfo_Destroy(si);
        return;
      }
      // Another node created it at the same moment: read it as an existing stream.
      if (jerr != JSStreamNameExistErr)
        check(s, std::string("cluster: creating stream ") + name, jerr);
      jerr = static_cast<jsErrCode>(0);
      s = js_GetStreamInfo(&si, js_, name, nullptr, &jerr);
    }
    check(s, std::string("cluster: stream ") + name, jerr);
    const jsStreamConfig* have = si->Config;
    const std::string what = std::string("stream ") + name;
    std::set<std::string> want_subj(subjects.begin(), subjects.end()), have_subj;
    for (int i = 0; i < have->SubjectsLen; ++i) have_subj.insert(have->Subjects[i]);
    if (want_subj != have_subj) {
      std::string a, b;
      for (const auto& x : have_subj) a += (a.empty() ? "" : " ") + x;
      for (const auto& x : want_subj) b += (b.empty() ? "" : " ") + x;
      notes.push_back(what + ": subjects are [" + a + "], the config says [" + b + "]");
    }
    differs(notes, what, "retention", static_cast<int>(have->Retention),
            static_cast<int>(sc.Retention));
    differs(notes, what, "discard", static_cast<int>(have->Discard), static_cast<int>(sc.Discard));
    differs(notes, what, "storage", static_cast<int>(have->Storage), static_cast<int>(sc.Storage));
    differs(notes, what, "replicas", have->Replicas, sc.Replicas);
    differs(notes, what, "max_msgs", have->MaxMsgs, sc.MaxMsgs);
    differs(notes, what, "max_bytes", have->MaxBytes, sc.MaxBytes);
    differs(notes, what, "max_age_ns", have->MaxAge, sc.MaxAge);
    differs(notes, what, "duplicate_window_ns", have->Duplicates, sc.Duplicates);
    jsStreamInfo_Destroy(si);
  };
  ensure(kJobsStream, job_subjects, true, cfg_.max_jobs, cfg_.max_job_bytes, 0);
  ensure(kResultsStream, result_subjects, false, -1, cfg_.results_max_bytes,
         cfg_.results_max_age_s * 1000 * kNsPerMs);
  ensure(kCancelsStream, {kCancelSubject}, false, cfg_.max_cancels, -1,
         cfg_.cancels_max_age_s * 1000 * kNsPerMs);
  return notes;
}

std::vector<std::string> NatsLink::bind_consumers() {
  std::vector<std::string> notes;
  for (auto* sub : subs_)
    if (sub) natsSubscription_Destroy(sub);
  subs_.assign(classes_.size(), nullptr);
  for (size_t i = 0; i < classes_.size(); ++i) {
    const std::string durable = durable_name(classes_[i]);
    const std::string subject = jobs_subject(classes_[i]);
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = durable.c_str();
    cc.FilterSubject = subject.c_str();
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    cc.AckWait = cfg_.ack_wait_ms * kNsPerMs;
    cc.MaxAckPending = cfg_.max_ack_pending;
    jsConsumerInfo* ci = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetConsumerInfo(&ci, js_, kJobsStream, durable.c_str(), nullptr, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr) {
      jerr = static_cast<jsErrCode>(0);
      s = js_AddConsumer(&ci, js_, kJobsStream, &cc, nullptr, &jerr);
    } else if (s == NATS_OK) {
      const std::string what = "consumer " + durable;
      differs(notes, what, "ack_wait_ns", ci->Config->AckWait, cc.AckWait);
      differs(notes, what, "max_ack_pending", ci->Config->MaxAckPending, cc.MaxAckPending);
    }
    check(s, "cluster: consumer " + durable, jerr);
    jsConsumerInfo_Destroy(ci);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = kJobsStream;
    so.Consumer = durable.c_str();
    jerr = static_cast<jsErrCode>(0);
    check(js_PullSubscribe(&subs_[i], js_, subject.c_str(), durable.c_str(), nullptr, &so, &jerr),
          "cluster: pull subscription " + durable, jerr);
  }
  return notes;
}

std::vector<Delivery> NatsLink::request(uint32_t class_index, int n, int64_t expires_ms) {
  std::vector<Delivery> out;
  if (class_index >= subs_.size() || !subs_[class_index] || n <= 0) return out;
  // A one-shot request (no_wait with an expiry): JetStream answers at once with what it has, or
  // with the first job that comes within the expiry, then closes the request with a status.
  jsFetchRequest req;
  jsFetchRequest_Init(&req);
  req.Batch = n;
  req.NoWait = true;
  req.Expires = expires_ms * kNsPerMs;
  natsMsgList list{};
  natsStatus s = natsSubscription_FetchRequest(&list, subs_[class_index], &req);
  if (s != NATS_OK) {
    natsMsgList_Destroy(&list);
    return out;  // a timeout (nothing queued) or a lost connection: the caller tries again
  }
  for (int i = 0; i < list.Count; ++i) {
    natsMsg* m = list.Msgs[i];
    if (!m) continue;
    list.Msgs[i] = nullptr;  // kept past natsMsgList_Destroy
    Delivery d;
    d.msg = std::shared_ptr<natsMsg>(m, natsMsg_Destroy);
    d.class_index = class_index;
    d.data.assign(natsMsg_GetData(m), static_cast<size_t>(natsMsg_GetDataLength(m)));
    d.reply_to = header(m, kReplyHeader);
    d.msg_id = header(m, "Nats-Msg-Id");
    jsMsgMetaData* meta = nullptr;
    if (natsMsg_GetMetaData(&meta, m) == NATS_OK && meta) {
      d.delivered = meta->NumDelivered;
      d.stream_seq = meta->Sequence.Stream;
      jsMsgMetaData_Destroy(meta);
    }
    fetched_.fetch_add(1, std::memory_order_relaxed);
    if (d.delivered > 1) redelivered_.fetch_add(1, std::memory_order_relaxed);
    out.push_back(std::move(d));
  }
  natsMsgList_Destroy(&list);
  return out;
}

std::vector<Delivery> NatsLink::fetch(uint32_t class_index, int n, int64_t wait_ms) {
  // libnats sends JetStream an expiry 10 ms shorter than its own wait when that wait is 20 ms
  // or more: asking for wait_ms + 10 makes JetStream's expiry wait_ms, and the 10 ms between
  // the two bring in what JetStream delivered up to its expiry (and its closing status).
  return request(class_index, n, std::max<int64_t>(10, wait_ms) + kFetchMarginMs);
}

int NatsLink::buffered(uint32_t class_index) const {
  if (class_index >= subs_.size() || !subs_[class_index]) return 0;
  int msgs = 0;
  if (natsSubscription_GetPending(subs_[class_index], &msgs, nullptr) != NATS_OK) return 0;
  return msgs;
}

std::vector<Delivery> NatsLink::take_buffered(uint32_t class_index) {
  const int n = buffered(class_index);
  // libnats hands out what its buffer holds before it asks JetStream for more: a batch of the
  // buffer's size asks for more only in place of the status messages among them.
  return n > 0 ? request(class_index, n, 10 + kFetchMarginMs) : std::vector<Delivery>{};
}

void NatsLink::request_into_buffer(uint32_t class_index, int n) {
  if (class_index >= subs_.size() || !subs_[class_index] || n <= 0) return;
  const char* sub_subject = natsSubscription_GetSubject(subs_[class_index]);
  if (!sub_subject) return;
  std::string inbox = sub_subject;
  // Versions of libnats that number their fetches subscribe to "<inbox>.*": any token will do.
  if (inbox.size() > 1 && inbox.compare(inbox.size() - 2, 2, ".*") == 0) inbox.back() = '0';
  const std::string subject = std::string("$JS.API.CONSUMER.MSG.NEXT.") + kJobsStream + "." +
                              durable_name(classes_[class_index]);
  // Open for 50 ms: what comes within it lands in the buffer as if a fetch had timed out.
  const std::string body = "{\"batch\":" + std::to_string(n) +
                           ",\"expires\":" + std::to_string(50 * kNsPerMs) + ",\"no_wait\":true}";
  natsConnection_PublishRequest(nc_, subject.c_str(), inbox.c_str(), body.data(),
                                static_cast<int>(body.size()));
}

uint64_t NatsLink::read_cancels(uint64_t from,
                                const std::function<void(const std::string&, int64_t)>& on_cancel) {
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  check(js_GetStreamInfo(&si, js_, kCancelsStream, nullptr, &jerr),
        std::string("cluster: stream ") + kCancelsStream, jerr);
  const uint64_t msgs = si->State.Msgs, last = si->State.LastSeq;
  jsStreamInfo_Destroy(si);
  from = std::max<uint64_t>(from, 1);
  if (msgs == 0 || last < from) return std::max(from, last + 1);
  // An ephemeral push consumer from `from`, read until JetStream says nothing is left after the
  // message (its NumPending), then removed.
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = kCancelsStream;
  so.ManualAck = true;
  so.Config.AckPolicy = js_AckNone;
  so.Config.DeliverPolicy = js_DeliverByStartSequence;
  so.Config.OptStartSeq = from;
  natsSubscription* sub = nullptr;
  jerr = static_cast<jsErrCode>(0);
  check(js_SubscribeSync(&sub, js_, kCancelSubject, nullptr, &so, &jerr),
        std::string("cluster: reading ") + kCancelsStream, jerr);
  std::unique_ptr<natsSubscription, void (*)(natsSubscription*)> owned(
      sub, [](natsSubscription* x) {
        natsSubscription_Unsubscribe(x);
        natsSubscription_Destroy(x);
      });
  uint64_t next = from;
  for (;;) {
    natsMsg* m = nullptr;
    check(natsSubscription_NextMsg(&m, sub, kRequestWaitMs),
          std::string("cluster: reading ") + kCancelsStream);
    std::unique_ptr<natsMsg, void (*)(natsMsg*)> msg(m, natsMsg_Destroy);
    jsMsgMetaData* meta = nullptr;
    uint64_t pending = 0;
    int64_t stored_ms = 0;
    if (natsMsg_GetMetaData(&meta, m) == NATS_OK && meta) {
      next = meta->Sequence.Stream + 1;
      pending = meta->NumPending;
      stored_ms = meta->Timestamp / kNsPerMs;
      jsMsgMetaData_Destroy(meta);
    }
    // Flow-control and heartbeat messages have no body.
    if (natsMsg_GetDataLength(m) > 0)
      on_cancel(std::string(natsMsg_GetData(m), static_cast<size_t>(natsMsg_GetDataLength(m))),
                stored_ms);
    if (pending == 0 || next > last) break;
  }
  return next;
}

bool NatsLink::ack(const Delivery& d) {
  if (!d.msg) return false;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  if (natsMsg_AckSync(d.msg.get(), nullptr, &jerr) != NATS_OK) return false;
  acked_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void NatsLink::in_progress(const Delivery& d) {
  if (d.msg) natsMsg_InProgress(d.msg.get(), nullptr);
}

void NatsLink::nak(const Delivery& d, int64_t delay_ms) {
  if (!d.msg) return;
  if (delay_ms > 0)
    natsMsg_NakWithDelay(d.msg.get(), delay_ms, nullptr);
  else
    natsMsg_Nak(d.msg.get(), nullptr);
}

void NatsLink::publish_result(const std::string& tenant, const std::string& msg_id,
                              const std::string& body,
                              const std::vector<std::pair<std::string, std::string>>& headers) {
  const std::string subject = results_subject(tenant);
  natsMsg* m = nullptr;
  check(natsMsg_Create(&m, subject.c_str(), nullptr, body.data(), static_cast<int>(body.size())),
        "cluster: result message");
  std::unique_ptr<natsMsg, void (*)(natsMsg*)> owned(m, natsMsg_Destroy);
  for (const auto& [k, v] : headers)
    check(natsMsgHeader_Set(m, k.c_str(), v.c_str()), "cluster: header " + k);
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MsgId = msg_id.c_str();
  po.MaxWait = kRequestWaitMs;
  jsPubAck* pa = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s = js_PublishMsg(&pa, js_, m, &po, &jerr);
  if (pa) {
    if (s == NATS_OK && pa->Duplicate) duplicates_.fetch_add(1, std::memory_order_relaxed);
    jsPubAck_Destroy(pa);
  }
  if (s != NATS_OK) {
    pub_failed_.fetch_add(1, std::memory_order_relaxed);
    check(s, "cluster: result of " + msg_id + " on " + subject, jerr);
  }
  published_.fetch_add(1, std::memory_order_relaxed);
}

void NatsLink::subscribe(const std::string& subject,
                         std::function<void(const std::string&)> on_msg) {
  auto l = std::make_unique<Listener>();
  l->fn = std::move(on_msg);
  auto cb = [](natsConnection*, natsSubscription*, natsMsg* m, void* closure) {
    auto* self = static_cast<Listener*>(closure);
    std::string data(natsMsg_GetData(m), static_cast<size_t>(natsMsg_GetDataLength(m)));
    natsMsg_Destroy(m);
    self->fn(data);
  };
  check(natsConnection_Subscribe(&l->sub, nc_, subject.c_str(), cb, l.get()),
        "cluster: subscribing to " + subject);
  listeners_.push_back(std::move(l));
}

bool NatsLink::publish(const std::string& subject, const std::string& body) {
  return natsConnection_Publish(nc_, subject.c_str(), body.data(), static_cast<int>(body.size())) ==
         NATS_OK;
}

uint64_t NatsLink::publish_job(const std::string& class_name, const std::string& tenant,
                               const std::string& id, const std::string& body,
                               const std::string& reply_to, bool* duplicate) {
  const std::string subject = jobs_subject(class_name);
  natsMsg* m = nullptr;
  check(natsMsg_Create(&m, subject.c_str(), nullptr, body.data(), static_cast<int>(body.size())),
        "cluster: job message");
  std::unique_ptr<natsMsg, void (*)(natsMsg*)> owned(m, natsMsg_Destroy);
  if (!reply_to.empty())
    check(natsMsgHeader_Set(m, kReplyHeader, reply_to.c_str()), "cluster: header");
  const std::string msg_id = job_msg_id(tenant, id);
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MsgId = msg_id.c_str();
  po.MaxWait = kRequestWaitMs;
  jsPubAck* pa = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s = js_PublishMsg(&pa, js_, m, &po, &jerr);
  uint64_t seq = 0;
  if (pa) {
    seq = pa->Sequence;
    if (duplicate) *duplicate = pa->Duplicate;
    jsPubAck_Destroy(pa);
  }
  check(s, "cluster: publishing job " + msg_id + " on " + subject, jerr);
  return seq;
}

void NatsLink::publish_cancel(const std::string& body) {
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = kRequestWaitMs;
  jsPubAck* pa = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s =
      js_Publish(&pa, js_, kCancelSubject, body.data(), static_cast<int>(body.size()), &po, &jerr);
  if (pa) jsPubAck_Destroy(pa);
  if (s == NATS_OK) return;
  // No SWITCHYARD_CANCELS yet (no responders, or only nodes that listen without storing it
  // and never answer): the nodes that run now hear it live. Sending it once more is harmless.
  if (s != NATS_NO_RESPONDERS && s != NATS_TIMEOUT)
    check(s, std::string("cluster: cancel on ") + kCancelSubject, jerr);
  s = natsConnection_Publish(nc_, kCancelSubject, body.data(), static_cast<int>(body.size()));
  if (s == NATS_OK) s = natsConnection_FlushTimeout(nc_, kRequestWaitMs);
  check(s, std::string("cluster: cancel on ") + kCancelSubject);
}

ClassLag NatsLink::lag(uint32_t class_index) {
  ClassLag l;
  if (class_index >= classes_.size()) return l;
  jsConsumerInfo* ci = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  const std::string durable = durable_name(classes_[class_index]);
  if (js_GetConsumerInfo(&ci, js_, kJobsStream, durable.c_str(), nullptr, &jerr) == NATS_OK && ci) {
    l.pending = ci->NumPending;
    l.ack_pending = ci->NumAckPending;
    l.redelivered = ci->NumRedelivered;
    jsConsumerInfo_Destroy(ci);
  }
  return l;
}

LinkCounters NatsLink::counters() const {
  LinkCounters c;
  c.fetched = fetched_.load(std::memory_order_relaxed);
  c.acked = acked_.load(std::memory_order_relaxed);
  c.redelivered = redelivered_.load(std::memory_order_relaxed);
  c.results_published = published_.load(std::memory_order_relaxed);
  c.publish_failures = pub_failed_.load(std::memory_order_relaxed);
  c.duplicate_results = duplicates_.load(std::memory_order_relaxed);
  c.disconnects = disconnects_.load(std::memory_order_relaxed);
  c.reconnects = reconnects_.load(std::memory_order_relaxed);
  c.connected = nc_ && natsConnection_Status(nc_) == NATS_CONN_STATUS_CONNECTED;
  return c;
}

}  // namespace sy::cluster
