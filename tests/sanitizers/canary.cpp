// Planted bugs, one per mode, that the sanitizer of this build must report (and turn into a
// non-zero exit). They prove that the instrumentation and the runtime options reach the tests:
// a sanitizer build whose canaries pass silently would make every clean run meaningless.
//   canary heap-overflow | use-after-free | leak | signed-overflow | misaligned | race
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

int g_counter = 0;           // written by two threads without synchronisation in "race"
void* volatile g_leak = nullptr;  // the only pointer to the "leak" block, then dropped

// Opaque to the optimiser, so the planted bugs are not folded away at -O1.
template <class T>
T launder_value(T v) {
  volatile T x = v;
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "heap-overflow") == 0) {
    int* a = new int[4]();
    int* p = launder_value(a);  // hides the size from UBSan's object-size check: ASan's to find
    std::printf("%d\n", p[launder_value(4)]);  // one past the end
    delete[] a;
  } else if (std::strcmp(mode, "use-after-free") == 0) {
    int* a = new int[4]();
    delete[] a;
    std::printf("%d\n", a[launder_value(1)]);
  } else if (std::strcmp(mode, "leak") == 0) {
    g_leak = std::malloc(launder_value<std::size_t>(4096));
    g_leak = nullptr;  // the only pointer is gone: a direct leak at exit
  } else if (std::strcmp(mode, "signed-overflow") == 0) {
    const int x = launder_value(INT_MAX);
    std::printf("%d\n", x + launder_value(1));
  } else if (std::strcmp(mode, "misaligned") == 0) {
    alignas(8) unsigned char buf[16] = {};
    auto* p = reinterpret_cast<int*>(buf + launder_value(1));
    std::printf("%d\n", *p);
  } else if (std::strcmp(mode, "race") == 0) {
    std::thread t([] { g_counter = g_counter + 1; });
    g_counter = g_counter + 1;
    t.join();
    std::printf("%d\n", g_counter);
  } else {
    std::fprintf(stderr, "canary: unknown mode '%s'\n", mode);
    return 2;
  }
  std::printf("canary %s: not detected\n", mode);
  return 0;
}
