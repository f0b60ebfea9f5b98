// server_make_test_model OUT_DIR: writes the server tests' fixture model (test_model.h); the
// Python server tests (tests/server) run `dsinfer serve` on it.
#include <cstdio>

#include "test_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  dsinfer::Status s = dsinfer::server::testing::write_server_test_model(argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "server_make_test_model: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}
