#pragma once
// ringfence-health's exit status, the same for every mode (like `dcgmi health -c`, which
// operators script against): the worst state any link is in.
namespace ringfence::tools {

enum class Verdict : int {
  Healthy = 0,  ///< every link ok
  Suspect = 1,  ///< some link suspect, slow, moved, or with corrupted chunks; a straggler; a digest mismatch
  Fenced = 2,   ///< some link fenced (or no plan avoids the fenced links)
  NoData = 3,   ///< nothing to judge: no file, no event, no link
};
/// Usage errors (a bad option): apart from the verdicts.
inline constexpr int kUsageError = 4;

constexpr Verdict worse(Verdict a, Verdict b) noexcept {
  // NoData never hides a real verdict; among the others the higher is worse.
  if (a == Verdict::NoData) return b;
  if (b == Verdict::NoData) return a;
  return static_cast<int>(a) >= static_cast<int>(b) ? a : b;
}

constexpr const char* to_string(Verdict v) noexcept {
  switch (v) {
    case Verdict::Healthy: return "healthy";
    case Verdict::Suspect: return "suspect";
    case Verdict::Fenced: return "fenced";
    case Verdict::NoData: return "no data";
  }
  return "?";
}

}  // namespace ringfence::tools
