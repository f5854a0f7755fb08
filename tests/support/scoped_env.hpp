#pragma once
// Sets an environment variable for the lifetime of the object (test-support code: the fakes
// read their settings from the environment; the library reads only RINGFENCE_* options).
#include <stdlib.h>

#include <string>

namespace ringfence::test {

struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace ringfence::test
