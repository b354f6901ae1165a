// `switchyard render-chat`: shows the prompt a `messages` submit becomes with a model's chat
// template (or --chat-template), as text or as token ids, without a server.
#pragma once

#include <string>
#include <vector>

#include "cli/args.hpp"

namespace sy::cli {

/// Usage lines of `render-chat` for the command's help text.
extern const char* const kRenderChatUsage;
/// Valued options and flags of `render-chat`.
extern const std::vector<std::string> kRenderChatOptions;
extern const std::vector<std::string> kRenderChatFlags;

/// Renders and prints; returns the exit status (1 when the template refuses the messages).
int cmd_render_chat(const Args& a);

}  // namespace sy::cli
