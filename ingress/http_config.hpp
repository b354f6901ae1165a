// Configuration of the OpenAI-compatible HTTP door (config `http`, flag --http; docs/http.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sy {

/// The HTTP door: where it listens, what it serves and the bounds it holds every client to.
struct HttpConfig {
  std::string bind;  // "HOST:PORT" (port 0: any free one); "" = off
  // The model's name in /v1/models and responses; "" = the model file's name without ".gguf".
  std::string model_name;
  // Open-tenant mode (no tenants configured): the tenant of a request without a `user` field.
  std::string default_tenant = "default";
  // The priority class the Batch API's lines run in; "" = "batch" when that class exists, else
  // the lowest-ranked one (a batch must never overtake interactive work).
  std::string batch_class;
  // Connections open at once; one more is answered 503 and closed. Each costs a socket and a
  // few KiB of buffers, so the bound is what keeps a connection flood from exhausting either.
  std::size_t max_connections = 1024;
  // The request line and headers together. Browsers and SDKs send well under 8 KiB; 16 KiB
  // leaves room for long bearer tokens and tracing headers. More: 431.
  std::size_t max_header_bytes = 16 * 1024;
  // A generation request's body: a prompt is at most 256 KiB of text (the edge limit), and JSON
  // escaping can double that; 4 MiB also takes a token-id prompt of a 128k context. More: 413.
  std::size_t max_body_bytes = std::size_t{4} << 20;
  // A new connection must deliver its request's headers within this time (a client trickling
  // them a byte at a time, slowloris, is closed); 10 s is ample for any real client.
  uint32_t header_timeout_ms = 10000;
  // A declared body must arrive within this time once the headers are read (a 100 MiB batch
  // file over a slow link included).
  uint32_t body_timeout_ms = 120000;
  // A keep-alive connection may wait this long for its next request (headers included).
  uint32_t idle_timeout_ms = 30000;
  // A response (or a stream chunk) the client does not take within this time closes the
  // connection and cancels its job: a peer that stopped reading must not hold a batch slot.
  uint32_t write_timeout_ms = 30000;
  // Stream bytes queued for a client that reads slower than tokens come; past this its job is
  // cancelled and the connection closed instead of buffering without end.
  std::size_t max_stream_backlog_bytes = std::size_t{4} << 20;
  // The Batch API (docs/http.md, Batch API): files and batches live under the state directory.
  uint64_t batch_max_file_bytes = uint64_t{100} << 20;  // one uploaded file (OpenAI: 200 MB)
  uint32_t batch_max_lines = 50000;                     // requests in one input file (OpenAI's)
  uint32_t batch_max_open = 64;                         // batches not finished, all tenants
  uint32_t batch_max_files = 10000;                     // files kept, all tenants
  // Lines of all batches running at once; 0 = three quarters of the sequences the batchers run
  // at most (batching.max_sequences × executors): enough to keep them busy, while a quarter of
  // their slots stays free, so an interactive request starts at the next step instead of
  // waiting for a batch line to end.
  uint32_t batch_max_in_flight = 0;
};

}  // namespace sy
