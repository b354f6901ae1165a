// `switchyard keygen --out PREFIX`: a fresh CURVE keypair from libzmq (zmq_curve_keypair), the
// secret written with mode 0600 so that only its owner can read it.
#include "cli/keygen.hpp"

#include <iostream>

#include "ingress/curve.hpp"

namespace sy::cli {

const char* const kKeygenUsage =
    "  keygen      --out PREFIX [--force]\n"
    "              Writes a CURVE keypair in Z85: PREFIX.key (secret, mode 0600: the server's\n"
    "              endpoints.curve_secret_key) and PREFIX.pub (public: clients' --server-key).\n"
    "              Refuses to replace existing files unless --force.\n";
const std::vector<std::string> kKeygenOptions = {"out"};
const std::vector<std::string> kKeygenFlags = {"force"};

int cmd_keygen(const Args& a) {
  std::string prefix = a.str("out");
  if (prefix.empty())
    throw UsageError("keygen needs --out PREFIX (writes PREFIX.key and PREFIX.pub)");
  if (!curve::available()) {
    std::cerr << "switchyard: error: keygen needs CURVE, but this libzmq was built without it "
                 "(zmq_has(\"curve\") is false)\n";
    return 1;
  }
  auto kp = curve::generate();
  curve::write_key_files(prefix, kp, a.has("force"));
  std::cerr << "switchyard: wrote " << prefix << ".key (secret, mode 0600) and " << prefix
            << ".pub\n";
  std::cout << kp.public_key << std::endl;
  return 0;
}

}  // namespace sy::cli
