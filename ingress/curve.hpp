// CURVE key files and socket setup, shared by the server (every bound socket is a CURVE server)
// and the clients (CURVE clients with an ephemeral keypair). Header-only: it needs only libzmq,
// which both the server and the client library link, and the codec library does not.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace sy::curve {

/// Z85 text of a 32-byte CURVE key: 32 * 5 / 4 characters.
inline constexpr std::size_t kZ85KeyChars = 40;
/// A CURVE key in binary.
inline constexpr std::size_t kKeyBytes = 32;

/// A keypair as Z85 text (40 characters each).
struct KeyPair {
  std::string public_key;  ///< shared with clients
  std::string secret_key;  ///< stays with its owner
};

/// True when the linked libzmq was built with CURVE (libsodium or its own tweetnacl).
inline bool available() {
  return zmq_has("curve") != 0;
}

/// Throws when CURVE is missing, saying what it was needed for.
inline void require(const std::string& what) {
  if (!available())
    throw std::runtime_error(
        what +
        " needs CURVE, but this libzmq was built without it (zmq_has(\"curve\") "
        "is false): install a libzmq built with libsodium (Debian's libzmq5 is)");
}

/// True when `text` is a well-formed Z85 key (40 characters of the Z85 alphabet).
inline bool is_z85_key(const std::string& text) {
  static constexpr char kAlphabet[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (text.size() != kZ85KeyChars) return false;
  for (char c : text)
    if (c == '\0' || std::strchr(kAlphabet, c) == nullptr) return false;
  return true;
}

/// The 32 binary bytes of a Z85 key; throws std::invalid_argument when it is not one.
inline std::array<uint8_t, kKeyBytes> decode(const std::string& z85) {
  std::array<uint8_t, kKeyBytes> out{};
  if (!is_z85_key(z85) || zmq_z85_decode(out.data(), z85.c_str()) == nullptr)
    throw std::invalid_argument("not a Z85 CURVE key (expected 40 characters of the Z85 alphabet)");
  return out;
}

/// A fresh keypair; throws when CURVE is missing.
inline KeyPair generate() {
  require("generating a CURVE keypair");
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0)
    throw std::runtime_error(std::string("zmq_curve_keypair failed: ") + zmq_strerror(zmq_errno()));
  KeyPair kp{pub, sec};
  // The secret stays only in the returned strings.
  std::memset(sec, 0, sizeof sec);
  return kp;
}

/// The public key that belongs to a Z85 secret key.
inline std::string public_of(const std::string& secret_z85) {
  require("deriving a CURVE public key");
  decode(secret_z85);  // refuses malformed text before libzmq sees it
  char pub[kZ85KeyChars + 1];
  if (zmq_curve_public(pub, secret_z85.c_str()) != 0)
    throw std::runtime_error(std::string("zmq_curve_public failed: ") + zmq_strerror(zmq_errno()));
  return pub;
}

/// Reads a key file written by `switchyard keygen` (or any file whose only non-blank,
/// non-'#' line is a 40-character Z85 key). `what` names the key in errors ("CURVE secret key");
/// every error names the file.
inline std::string read_key_file(const std::string& path, const std::string& what) {
  auto fail = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error(what + " file '" + path + "': " + why);
  };
  std::ifstream f(path, std::ios::binary);
  if (!f) throw fail(std::string("cannot open: ") + std::strerror(errno));
  std::string line, key;
  int keys = 0;
  // Key files are tiny; a large file is not one (and must not be read whole into memory).
  constexpr std::size_t kMaxFileBytes = 4096;
  std::size_t total = 0;
  while (std::getline(f, line)) {
    total += line.size() + 1;
    if (total > kMaxFileBytes) throw fail("too large for a key file (over 4096 bytes)");
    auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    auto e = line.find_last_not_of(" \t\r");
    key = line.substr(b, e - b + 1);
    ++keys;
  }
  if (keys == 0) throw fail("empty: expected one 40-character Z85 key");
  if (keys > 1) throw fail("more than one key line: expected one 40-character Z85 key");
  if (!is_z85_key(key))
    throw fail("malformed: expected one 40-character Z85 key, found " + std::to_string(key.size()) +
               " characters" + (key.size() == kZ85KeyChars ? " outside the Z85 alphabet" : ""));
  return key;
}

/// True when the file can be read by its group or others (a secret key should be 0600).
inline bool readable_by_others(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0;
}

/// Writes `text` to a new file with `mode` (umask not applied: fchmod after open). Refuses to
/// overwrite an existing file unless `overwrite`.
inline void write_new_file(const std::string& path, const std::string& text, mode_t mode,
                           bool overwrite) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  int fd = ::open(path.c_str(), flags, mode);
  if (fd < 0) {
    int err = errno;
    if (err == EEXIST)
      throw std::runtime_error("'" + path + "' exists already (pass --force to replace it)");
    throw std::runtime_error("cannot create '" + path + "': " + std::strerror(err));
  }
  // An existing file opened for overwrite keeps its old mode unless it is set again.
  int err = ::fchmod(fd, mode) == 0 ? 0 : errno;
  std::size_t off = 0;
  while (err == 0 && off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      err = n < 0 ? errno : EIO;
    else
      off += static_cast<std::size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) throw std::runtime_error("cannot write '" + path + "': " + std::strerror(err));
}

/// Writes PREFIX.key (the secret key, mode 0600) and PREFIX.pub (the public key, mode 0644).
inline void write_key_files(const std::string& prefix, const KeyPair& kp, bool overwrite = false) {
  // Both checked first, so that a refusal leaves no half-written pair behind.
  if (!overwrite)
    for (const char* ext : {".key", ".pub"}) {
      struct stat st {};
      if (::lstat((prefix + ext).c_str(), &st) == 0)
        throw std::runtime_error("'" + prefix + ext +
                                 "' exists already (pass --force to replace it)");
    }
  write_new_file(prefix + ".key",
                 "# Switchyard CURVE secret key (Z85). Keep it private: whoever has it can pose as "
                 "the server.\n" +
                     kp.secret_key + "\n",
                 0600, overwrite);
  write_new_file(prefix + ".pub",
                 "# Switchyard CURVE public key (Z85). Give it to clients (--server-key).\n" +
                     kp.public_key + "\n",
                 0644, overwrite);
}

/// Makes a (not yet bound) socket a CURVE server with this Z85 secret key.
inline void make_server(void* socket, const std::string& secret_z85) {
  auto sec = decode(secret_z85);
  int one = 1;
  if (zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
      zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, sec.data(), sec.size()) != 0)
    throw std::runtime_error(std::string("cannot make the socket a CURVE server: ") +
                             zmq_strerror(zmq_errno()));
  sec.fill(0);
}

/// Makes a (not yet connected) socket a CURVE client of the server with this Z85 public key.
/// Its own keypair is `client_secret_z85` (and the public key that belongs to it) when given —
/// what a server with a client allow-list (endpoints.curve_allowed_keys) needs — else a fresh
/// ephemeral one (enough for a server that accepts any client knowing its key).
inline void make_client(void* socket, const std::string& server_public_z85,
                        const std::string& client_secret_z85 = {}) {
  require("a CURVE connection (--server-key)");
  auto server = decode(server_public_z85);
  KeyPair mine = client_secret_z85.empty()
                     ? generate()
                     : KeyPair{public_of(client_secret_z85), client_secret_z85};
  auto pub = decode(mine.public_key), sec = decode(mine.secret_key);
  if (zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, server.data(), server.size()) != 0 ||
      zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, pub.data(), pub.size()) != 0 ||
      zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, sec.data(), sec.size()) != 0)
    throw std::runtime_error(std::string("cannot make the socket a CURVE client: ") +
                             zmq_strerror(zmq_errno()));
  sec.fill(0);
}

}  // namespace sy::curve
