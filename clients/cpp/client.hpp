// The C++ client library of Switchyard (no CAF): a DEALER client for the request endpoint, a
// Pusher for the pipeline input and a Sink for the pipeline results. Speaks docs/protocol.md.
// A job is a wire::Submit: a `prompt` (text or token ids), chat `messages` (chat_submit) or a
// program (program_submit, docs/programs.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "core/wire.hpp"
#include "ingress/codec.hpp"

namespace sy::client {

using std::chrono::milliseconds;

/// A submit of a conversation, which the server renders with the model's chat template (message
/// text never becomes control tokens); set max_tokens, temperature, ... on it as on any submit.
inline wire::Submit chat_submit(std::string id, std::string tenant,
                                std::vector<wire::ChatMessage> messages) {
  wire::Submit s;
  s.id = std::move(id);
  s.tenant = std::move(tenant);
  s.messages = std::move(messages);
  return s;
}

/// A `score` request: each continuation (text, tokenized without BOS as text after the prompt;
/// or token ids) gets its summed log-probability after `prompt`, in Result::done->scores.
inline wire::Submit score_request(
    std::string id, std::string tenant, std::variant<std::string, std::vector<std::int32_t>> prompt,
    std::vector<std::variant<std::string, std::vector<std::int32_t>>> continuations) {
  wire::Submit s;
  s.score = true;
  s.id = std::move(id);
  s.tenant = std::move(tenant);
  s.prompt = std::move(prompt);
  s.continuations = std::move(continuations);
  return s;
}

/// A program (docs/programs.md): `program_json` is the JSON array of its steps as text (e.g.
/// `[{"type":"text","text":"Q: {{q}}\nA:"},{"type":"gen","name":"a","max_tokens":32}]`), sent
/// as the wire's `program` array; `inputs` fill its `{{name}}` templates. The submit's sampling
/// fields are the defaults of every gen step; `stream` streams every gen step's tokens.
inline wire::Submit program_submit(std::string id, std::string tenant, std::string program_json,
                                   std::vector<std::pair<std::string, std::string>> inputs = {}) {
  wire::Submit s;
  s.id = std::move(id);
  s.tenant = std::move(tenant);
  s.program = std::move(program_json);
  s.inputs = std::move(inputs);
  return s;
}

/// Thrown when the server sends bytes this client cannot decode, or a send fails.
struct ClientError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Everything one job produced, as collected by Client::run.
struct Result {
  std::optional<wire::Accepted> accepted;
  std::vector<wire::Tokens> chunks;  ///< streamed chunks (stream = true), in arrival order
  std::vector<std::int32_t> ids;     ///< completion ids: done.ids, or the chunks' ids if streamed
  std::string text;                  ///< completion text: done.text, or the chunks' text
  /// Per completion id when the job asked for logprobs: done.logprobs, or the chunks' logprobs.
  std::vector<wire::TokenLogprobs> logprobs;
  /// A job with n > 1: each sample, by index, from its streamed chunks and the done's choices.
  std::vector<wire::Choice> choices;
  std::optional<wire::Done> done;    ///< set when the job finished
  std::optional<wire::Error> error;  ///< set when it failed
  bool timed_out = false;            ///< neither came before the timeout
  /// A program: its `step` events, in arrival order (its streamed chunks, which name their step,
  /// are in `chunks` only: `text`, `ids` and `choices` stay the program's result).
  std::vector<wire::Step> steps;
  /// A program: the `tool_call` events it sent, in arrival order (answered or not).
  std::vector<wire::ToolCall> tool_calls;
  /// True when the job finished with done.
  bool ok() const { return done.has_value(); }
  /// A program's variable `name` from its done (an input, a step's output, a join's list);
  /// null when absent or not done.
  const wire::Var* var(std::string_view name) const;
  /// The text a program's streamed chunks gave step `path` ("2.1.0").
  std::string step_text(std::string_view path) const;
};

/// Answers a program's tool_call: the tool's output, or nullopt to leave the call to another
/// client (the program then waits up to the tool step's tool_timeout_ms).
using ToolHandler = std::function<std::optional<std::string>(const wire::ToolCall&)>;

/// The answer to a control command (Client::control).
struct ControlResult {
  std::optional<wire::ControlReply> reply;  ///< set on success: reply->result is JSON text
  std::optional<wire::Error> error;         ///< set when the server refused or failed it
  bool timed_out = false;                   ///< neither came before the timeout
  /// True when the server answered with control_reply.
  bool ok() const { return reply.has_value(); }
};

/// Receive-side socket options of a Client (ZeroMQ's and the OS's defaults unless set).
struct ClientOptions {
  int rcvhwm = 1000;  ///< ZMQ_RCVHWM: messages queued before the server's sends back up
  int rcvbuf = -1;    ///< ZMQ_RCVBUF in bytes; -1: the OS default
  /// The server's CURVE public key (Z85, 40 characters; read_server_key reads a file): the socket
  /// becomes a CURVE client with an ephemeral keypair of its own. "": plain TCP.
  /// (Default-initialized explicitly so that `ClientOptions{hwm, buf}` stays warning-free.)
  std::string server_key = {};
  /// This client's own CURVE secret key (Z85; read_client_key reads a PREFIX.key file), needed
  /// when the server admits only listed client keys (endpoints.curve_allowed_keys); its public
  /// key is derived from it. "": a fresh ephemeral keypair. Only used with server_key.
  std::string client_key = {};
};

/// Reads the server's CURVE public key from a file written by `switchyard keygen` (PREFIX.pub);
/// throws std::runtime_error naming the file when it is missing or malformed.
std::string read_server_key(const std::string& path);

/// Reads this client's CURVE secret key from a file written by `switchyard keygen` (PREFIX.key);
/// throws std::runtime_error naming the file when it is missing or malformed.
std::string read_client_key(const std::string& path);

/// A DEALER connection to the server's request endpoint (ROUTER). Not thread-safe: one thread
/// per Client (ZeroMQ sockets belong to one thread).
class Client {
 public:
  /// Connects to `endpoint` (e.g. "tcp://127.0.0.1:5555") with its own ZeroMQ context.
  explicit Client(const std::string& endpoint);
  /// The same with receive options (a small rcvhwm makes a client that reads slowly push back
  /// on the server at once).
  Client(const std::string& endpoint, const ClientOptions& options);
  /// Connects using a shared context (many clients in one process).
  Client(zmq::context_t& ctx, const std::string& endpoint);

  /// Sends one client message.
  void send(const wire::ClientMessage& m);
  /// Sends raw bytes as one frame (tests of malformed input).
  void send_raw(const void* data, std::size_t size);
  /// Sends a submit.
  void submit(const wire::Submit& s) { send(s); }
  /// Sends a cancel for (tenant, id).
  void cancel(const std::string& id, const std::string& tenant, const std::string& token = "");
  /// Sends a status request for (tenant, id).
  void status(const std::string& id, const std::string& tenant, const std::string& token = "");
  /// Sends a ping.
  void ping(std::uint64_t seq = 0) { send(wire::Ping{seq}); }
  /// Answers a program's tool_call with the tool's output (`token`: the tenant's token). The
  /// server replies only when it refuses it (an error not_found naming the program's id).
  void tool_result(const wire::ToolCall& call, std::string content, const std::string& token = "");

  /// The next server message (first those set aside by run/ping_wait), or nullopt after
  /// `timeout`. Throws ClientError on undecodable bytes.
  std::optional<wire::ServerMessage> next(milliseconds timeout);

  /// Submits and waits for the job's done or error (at most `timeout` between two messages),
  /// collecting accepted and streamed chunks. Messages of other jobs (another id, or the same id
  /// of another tenant) are kept for next().
  Result run(const wire::Submit& s, milliseconds timeout = milliseconds(60000));
  /// Waits for the job's done or error without submitting (after submit()). With `tenant`, only
  /// messages naming that tenant (or none) count as the job's.
  Result wait(const std::string& id, milliseconds timeout = milliseconds(60000),
              const std::string& tenant = "");
  /// Submits a program and waits for its done or error as run() does, answering each of its
  /// tool_calls with `tools` (a ToolResult with s.token) as it arrives; steps and tool calls are
  /// collected in the Result.
  Result run_program(const wire::Submit& s, const ToolHandler& tools,
                     milliseconds timeout = milliseconds(60000));
  /// Sends an operator command ("kv_policy" with `policy`, or "stats") with the admin `token` and
  /// waits up to `timeout` in all for its control_reply or for an error without a job id. Replies
  /// carry no id, so keep one command in flight per Client; other messages are kept for next().
  ControlResult control(const std::string& command, const std::string& policy,
                        const std::string& token, milliseconds timeout = milliseconds(5000));
  /// Pings and waits for the matching pong; false on timeout.
  bool ping_wait(milliseconds timeout = milliseconds(5000));

  /// The underlying socket (for zmq::poll over many clients).
  zmq::socket_t& socket() { return sock_; }

 private:
  std::optional<wire::ServerMessage> recv(milliseconds timeout);
  std::unique_ptr<zmq::context_t> own_ctx_;
  zmq::socket_t sock_;
  std::deque<wire::ServerMessage> pending_;
  std::uint64_t ping_seq_ = 0;
};

/// A PUSH connection to the server's pipeline input (PULL). Sends block at the high-water mark:
/// that is the server's backpressure. Destroying it waits (up to 60 s) until the jobs ZeroMQ
/// still holds are handed to the server.
class Pusher {
 public:
  /// Connects to `endpoint` with its own context.
  explicit Pusher(const std::string& endpoint);
  /// Connects using a shared context.
  Pusher(zmq::context_t& ctx, const std::string& endpoint);
  /// Connects with its own context and options (server_key: CURVE).
  Pusher(const std::string& endpoint, const ClientOptions& options);
  /// Sends a submit; blocks while the server is not reading. False when `timeout` passed first
  /// (negative: wait forever).
  bool submit(const wire::Submit& s, milliseconds timeout = milliseconds(-1));
  /// Sends any client message (e.g. cancel).
  bool send(const wire::ClientMessage& m, milliseconds timeout = milliseconds(-1));
  /// Sends raw bytes as one frame.
  bool send_raw(const void* data, std::size_t size, milliseconds timeout = milliseconds(-1));
  /// The underlying socket.
  zmq::socket_t& socket() { return sock_; }

 private:
  std::unique_ptr<zmq::context_t> own_ctx_;
  zmq::socket_t sock_;
};

/// A PULL connection to the server's pipeline results (PUSH): done and error messages.
class Sink {
 public:
  /// Connects to `endpoint` with its own context.
  explicit Sink(const std::string& endpoint);
  /// Connects using a shared context.
  Sink(zmq::context_t& ctx, const std::string& endpoint);
  /// Connects with its own context and options (server_key: CURVE).
  Sink(const std::string& endpoint, const ClientOptions& options);
  /// The next result, or nullopt after `timeout`. Throws ClientError on undecodable bytes.
  std::optional<wire::ServerMessage> next(milliseconds timeout);
  /// The underlying socket.
  zmq::socket_t& socket() { return sock_; }

 private:
  std::unique_ptr<zmq::context_t> own_ctx_;
  zmq::socket_t sock_;
};

/// Adds one message of a job to its Result (accepted, a streamed chunk, a program's step or
/// tool_call, done or error); true when it ended the job (done or error). Status replies change
/// nothing.
bool add_to_result(Result& r, wire::ServerMessage&& m);

/// Collects job `id`'s messages (of `tenant`; "" = any) into a Result until its done or error:
/// first those set aside in `pending`, then what `recv` gives; others' messages are set aside
/// in `pending` for later. timed_out when `recv` gives nothing within `timeout`. `on_tool_call`,
/// when set, sees each of the job's tool_calls as it is added (to answer it).
Result collect_job(
    std::deque<wire::ServerMessage>& pending,
    const std::function<std::optional<wire::ServerMessage>(std::chrono::milliseconds)>& recv,
    const std::string& id, std::chrono::milliseconds timeout, const std::string& tenant,
    const std::function<void(const wire::ToolCall&)>& on_tool_call = {});

/// The job id a server message refers to ("" for pong and id-less errors).
std::string message_id(const wire::ServerMessage& m);
/// The tenant a server message names ("" for pong, control_reply and replies without one).
std::string message_tenant(const wire::ServerMessage& m);
/// One line describing a server message (examples, logs).
std::string describe(const wire::ServerMessage& m);

}  // namespace sy::client
