// libFuzzer entry point for the wire decoder: any bytes must give a message or a DecodeError,
// never a crash, and whatever decodes must survive an encode → decode round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <variant>

#include "ingress/codec.hpp"

namespace {

// Aborts (a finding for libFuzzer) when a decoded message does not round-trip.
template <class Message, class Decode, class Encode>
void check_round_trip(const Message& m, Decode decode, Encode encode) {
  const std::string again = encode(m);
  auto r = decode(again.data(), again.size(), sy::wire::DecodeLimits{});
  if (!std::holds_alternative<Message>(r) || !(std::get<Message>(r) == m)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sy::wire;
  // Small limits as well as the defaults, so the limit paths are reached by short inputs.
  DecodeLimits small;
  small.max_depth = 4;
  small.max_array = 8;
  small.max_map = 8;
  small.max_string_bytes = 32;
  small.max_prompt_tokens = 4;
  for (const DecodeLimits& lim : {DecodeLimits{}, small}) {
    auto c = decode_client(data, size, lim);
    if (auto* m = std::get_if<ClientMessage>(&c))
      check_round_trip(
          *m,
          [](const void* d, std::size_t n, const DecodeLimits& l) {
            return decode_client(d, n, l);
          },
          [](const ClientMessage& x) { return encode_client(x); });
    auto s = decode_server(data, size, lim);
    if (auto* m = std::get_if<ServerMessage>(&s))
      check_round_trip(
          *m,
          [](const void* d, std::size_t n, const DecodeLimits& l) {
            return decode_server(d, n, l);
          },
          [](const ServerMessage& x) { return encode_server(x); });
  }
  return 0;
}
