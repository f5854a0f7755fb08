#pragma once
// The fake NVML's state file (tests/support/fake_nvml.cpp) for one test: a scratch directory
// holding "state", named by RINGFENCE_FAKE_NVML_STATE while the object lives (test-support code:
// setting the environment here is intended; the library reads only RINGFENCE_* options).
#include <stdlib.h>

#include <string>
#include <string_view>

#include "temp_dir.hpp"

namespace ringfence::test {

class FakeNvmlState {
 public:
  FakeNvmlState(std::string_view prefix, std::string_view initial) : dir_(prefix) {
    write(initial);
    const std::string state = (dir_.path() / "state").string();
    ::setenv("RINGFENCE_FAKE_NVML_STATE", state.c_str(), 1);
  }
  ~FakeNvmlState() { ::unsetenv("RINGFENCE_FAKE_NVML_STATE"); }
  FakeNvmlState(const FakeNvmlState&) = delete;
  FakeNvmlState& operator=(const FakeNvmlState&) = delete;

  // Replaces the state (the fake re-reads it on every call).
  void write(std::string_view content) const { dir_.write("state", content); }

 private:
  TempDir dir_;
};

}  // namespace ringfence::test
