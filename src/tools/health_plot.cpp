// ringfence-health --plot (health_plot.hpp): a health-event log drawn with gnuplot.
#include "health_plot.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <ringfence/events.hpp>
#include <set>
#include <sstream>
#include <vector>

namespace ringfence::tools {

namespace {

namespace fs = std::filesystem;
using ringfence::EventKind;

enum State : int { Ok, Suspect, Slow, Fenced, Moved, kStates };
constexpr std::array<const char*, kStates> kStateName{"ok", "suspect", "slow", "fenced", "moved"};
constexpr std::array<const char*, kStates> kStateColor{"#9bd39b", "#f2c14e", "#c39bd8", "#d1495b", "#7fa7dc"};

// Evidence goes above a link's bar and agreed decisions below it, so that a link_slow and the
// link_fenced it leads to (same collective, same millisecond) do not hide each other.
struct Mark {
  EventKind kind;
  const char *title, *color;
  int point;  // gnuplot point type
  double dy;  // offset from the link's row
};
constexpr std::array<Mark, 5> kMarks{{
    {EventKind::ChecksumErrors, "checksum_errors (corrupted chunks)", "#000000", 2, -0.36},
    {EventKind::LinkSlow, "link_slow", "#6a3d9a", 5, -0.36},
    {EventKind::LinkFenced, "link_fenced", "#a50f15", 11, 0.36},
    {EventKind::LinkReadmitted, "link_readmitted", "#1b7837", 9, 0.36},
    {EventKind::LinkMoved, "link_moved", "#08519c", 13, 0.36},
}};

struct Link {
  std::vector<std::pair<double, State>> changes;  // (time, state from then on)
  // (mark index, collective) -> (time first reported, summed count): every rank reports an
  // agreement, and each end of a link its own corrupted chunks; one mark per collective.
  std::map<std::pair<std::size_t, std::uint64_t>, std::pair<double, std::uint64_t>> marks;
};

// The state after `kind`: the reading of ringfence-health's summary (health_log.cpp).
State next_state(State s, EventKind kind) noexcept {
  switch (kind) {
    case EventKind::ChecksumErrors:
    case EventKind::FenceProposed:
    case EventKind::LinkSuspect: return s == Ok || s == Moved ? Suspect : s;
    case EventKind::LinkHealthy: return s == Suspect ? Ok : s;
    case EventKind::LinkSlow: return s == Fenced ? s : Slow;
    case EventKind::LinkFenced:
    case EventKind::NoPlan: return Fenced;
    case EventKind::LinkReadmitted: return Ok;
    case EventKind::LinkMoved: return Moved;
    default: return s;
  }
}

// `s` single-quoted, a quote inside written as `q`: '' for gnuplot, '\'' for the shell.
std::string quote(const std::string& s, const std::string& q) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? q : std::string(1, c);
  return out + "'";
}

// Removes the temporary directory whichever way the function returns.
struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

// The last non-empty line of `path`: gnuplot prints its error last before it exits.
std::string last_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t^") != std::string::npos) last = line;
  return last.empty() ? "no message" : last;
}

// Writes `links` into `data` as gnuplot data blocks, one per state present (boxes: x y xlow
// xhigh ylow yhigh) and per mark kind present (x y count), and returns the plot clauses.
// Empty blocks are left out: gnuplot's `index` would count a run of blank lines only once.
std::vector<std::string> write_blocks(const std::map<std::pair<int, int>, Link>& links, double end,
                                      const fs::path& data) {
  std::array<std::ostringstream, kStates + kMarks.size()> blocks;  // states, then marks
  for (auto& b : blocks) b.precision(10);
  int row = 0;
  for (const auto& [id, l] : links) {
    for (std::size_t i = 0; i < l.changes.size(); ++i) {
      const double x0 = l.changes[i].first, x1 = i + 1 < l.changes.size() ? l.changes[i + 1].first : end;
      blocks[l.changes[i].second] << (x0 + x1) / 2 << ' ' << row << ' ' << x0 << ' ' << x1 << ' ' << row - 0.2 << ' '
                                  << row + 0.2 << '\n';
    }
    for (const auto& [key, mark] : l.marks)
      blocks[kStates + key.first] << mark.first << ' ' << row + kMarks[key.first].dy << ' ' << mark.second << '\n';
    ++row;
  }
  std::ofstream d(data);
  std::vector<std::string> plots;
  int index = 0;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].str().empty()) continue;
    d << blocks[b].str() << "\n\n";
    const std::string source = quote(data.string(), "''") + " index " + std::to_string(index++);
    if (b < kStates) {
      plots.push_back(source + " using 1:2:3:4:5:6 with boxxyerror fs solid 0.9 noborder lc rgb '" + kStateColor[b] +
                      "' title 'state " + kStateName[b] + "'");
      continue;
    }
    const Mark& m = kMarks[b - kStates];
    plots.push_back(source + " using 1:2 with points pt " + std::to_string(m.point) + " ps 2 lw 2 lc rgb '" + m.color +
                    "' title '" + m.title + "'");
    if (m.kind == EventKind::ChecksumErrors) plots.push_back(source + " using 1:2:3 with labels offset 0,1.1 notitle");
  }
  if (!d) plots.clear();
  return plots;
}

}  // namespace

int plot_health_log(const std::string& log_path, const std::string& png_path) {
  std::ifstream in(log_path);
  if (!in) {
    std::fprintf(stderr, "ringfence-health: cannot read '%s'\n", log_path.c_str());
    return 3;
  }
  std::vector<HealthEvent> events;
  for (std::string line; std::getline(in, line);)
    if (auto e = parse_event_json(line)) events.push_back(std::move(*e));
  if (events.empty()) {
    std::fprintf(stderr, "ringfence-health: no events to plot in '%s'\n", log_path.c_str());
    return 3;
  }
  // Ranks append independently, so the lines are only roughly in time order.
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& x, const auto& y) { return x.unix_time < y.unix_time; });
  const double t0 = events.front().unix_time, span = events.back().unix_time - t0;
  // A fence agreement takes well under a millisecond, so one job's log often spans less than
  // one: in seconds every mark would sit at 0.
  const double scale = span >= 2.0 ? 1.0 : span >= 2e-3 ? 1e3 : 1e6;
  const char* unit = scale == 1.0 ? "s" : scale == 1e3 ? "ms" : "us";
  // Margins on both sides: the state before the first event shows, and no mark sits on the border.
  const double pad = span > 0 ? span * scale * 0.06 : 1.0, end = span * scale + pad;

  std::map<std::pair<int, int>, Link> links;
  std::set<int> ranks;
  for (const auto& e : events) {
    ranks.insert(e.rank);
    if (e.a < 0 || e.kind == EventKind::Replanned || e.kind == EventKind::Straggler ||
        e.kind == EventKind::DigestMismatch)
      continue;
    Link& l = links[{e.a, e.b}];
    if (l.changes.empty()) l.changes.emplace_back(-pad, Ok);  // what the log says before its first event
    const double t = (e.unix_time - t0) * scale;
    if (const State s = next_state(l.changes.back().second, e.kind); s != l.changes.back().second)
      l.changes.emplace_back(t, s);
    for (std::size_t m = 0; m < kMarks.size(); ++m)
      if (kMarks[m].kind == e.kind) l.marks.try_emplace({m, e.sequence}, t, 0).first->second.second += e.count;
  }
  if (links.empty()) {
    std::fprintf(stderr, "ringfence-health: no event about a link to plot in '%s'\n", log_path.c_str());
    return 3;
  }

  std::string dir = (fs::temp_directory_path() / "ringfence-health-plot.XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "ringfence-health: cannot create %s to draw '%s'\n", dir.c_str(), png_path.c_str());
    return 1;
  }
  const TempDir tmp{dir};
  const fs::path script = tmp.path / "plot.gp", err = tmp.path / "gnuplot.err";
  const std::vector<std::string> plots = write_blocks(links, end, tmp.path / "data.txt");
  std::string ytics;
  int rows = 0;
  for (auto it = links.begin(); it != links.end(); ++it, ++rows)
    ytics += (rows ? ", '" : "'") + std::to_string(it->first.first) + "-" + std::to_string(it->first.second) + "' " +
             std::to_string(rows);
  char first[64] = "?";
  const auto t0s = static_cast<std::time_t>(t0);
  if (std::tm tm{}; ::gmtime_r(&t0s, &tm)) std::strftime(first, sizeof first, "%Y-%m-%d %H:%M:%S UTC", &tm);
  const std::string size = " size 1100," + std::to_string(std::max(380, 170 + 80 * rows));
  std::ofstream g(script);
  g << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo noenhanced" << size
    << " font 'Sans,11' } else { set terminal png noenhanced" << size << " }\nset output " << quote(png_path, "''")
    << "\nset title "
    << quote("link health: " + fs::path(log_path).filename().string() + ", " + std::to_string(events.size()) +
                 " events from " + std::to_string(ranks.size()) + " ranks, first at " + first,
             "''")
    << "\nset xlabel 'time since the first event (" << unit << ")'\nset xrange [" << -pad << ":" << end
    << "]\nset ylabel 'link'\nset yrange [" << rows - 0.4 << ":-0.9]\nset ytics (" << ytics
    << ")\nset grid xtics lc rgb '#d0d0d0'\nset key outside right top box\nplot ";
  for (std::size_t i = 0; i < plots.size(); ++i) g << (i ? ", \\\n     " : "") << plots[i];
  g << '\n';
  g.close();
  if (plots.empty() || !g) {
    std::fprintf(stderr, "ringfence-health: cannot write gnuplot's files in %s to draw '%s'\n", dir.c_str(),
                 png_path.c_str());
    return 1;
  }
  const int rc = std::system(
      ("gnuplot " + quote(script.string(), "'\\''") + " >/dev/null 2>" + quote(err.string(), "'\\''")).c_str());
  std::error_code ec;
  if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0 || fs::file_size(png_path, ec) == 0 || ec) {
    const bool missing = rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 127;
    std::fprintf(stderr, "ringfence-health: cannot draw '%s' from '%s': %s\n", png_path.c_str(), log_path.c_str(),
                 missing ? "gnuplot not found (Debian: apt-get install gnuplot-nox)" : last_line(err).c_str());
    return 1;
  }
  return 0;
}

}  // namespace ringfence::tools
