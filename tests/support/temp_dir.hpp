#pragma once
// A scratch directory for tests: created unique under $TMPDIR (or /tmp), removed with its
// contents when the object dies. Plus small helpers to write and remove files under it.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace ringfence::test {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "ringfence-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

  // Writes `content` to `relative` (parents created), replacing the file.
  std::filesystem::path write(const std::filesystem::path& relative, std::string_view content) const {
    const std::filesystem::path p = path_ / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << content;
    if (!out) throw std::runtime_error("cannot write " + p.string());
    return p;
  }
  void remove(const std::filesystem::path& relative) const { std::filesystem::remove(path_ / relative); }
  void mkdir(const std::filesystem::path& relative) const { std::filesystem::create_directories(path_ / relative); }

 private:
  std::filesystem::path path_;
};

}  // namespace ringfence::test
