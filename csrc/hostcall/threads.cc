// Thread budgets: how many threads the BLAS libraries (and torch, which asks here) use
// inside a host call.
//
// A host function's NumPy/SciPy/torch work runs on the libraries' own thread pools. Left
// alone, a large matmul uses every core, as it would outside jaxbridge; capped at one
// thread it takes 2x as long on 2 cores, 8-16x on the machines users train on. But the
// same pools hurt where cores are contended: a rule's 256x256 matmul inside a jitted
// gradient ran 1.6x slower with two BLAS threads than with one on an idle 2-core machine
// (XLA's own threads spin on the cores), 2.4x slower with another process busy, and
// per-shard calls running at once would each start a pool of every core's size
// (benchmarks/threads.py measures each case). So, by default ("auto"):
//
// * Calls running at once -- per-shard calls, or calls XLA runs in parallel -- share the
//   cores: each gets max(1, threads / concurrent calls), counting the calls a program
//   is known to run at once (its devices) as well as those running now.
// * A call that runs alone gets either the libraries' own thread count or one thread,
//   whichever its function has been measured to run faster with: after its first call
//   the calls alternate between the two (ThreadTuner::kSamples each), then the choice
//   with the smaller median is used, every thread only where it wins by
//   kThreadsMustWinBy: threads that bring nothing are better left to XLA and to other
//   processes (with a core held by another process, a 1500x1500 matmul ran as fast or
//   10% faster with one thread, and a margin asked of one thread instead threw that
//   away). Every kProbeSeconds the other choice is tried again (kProbeCalls calls in a
//   row) and compared with the chosen one's last kSamples calls just before, so that
//   the choice follows the machine's load; it switches when kProbesToSwitch probes in a
//   row find the other faster, or one finds it kClearWin times faster (a wrong choice
//   must not last: a torch forward and backward explored in step and then run with
//   different counts resize torch's pool on every call, which cost an MLP step 2.4x
//   with a core busy). Only recent samples are compared: on a machine whose speed
//   drifts, a probe's samples against ones seconds old switched a torch MLP step to one
//   thread for seconds at a time (its matmuls then ran on one core of two).
//
// JAXBRIDGE_HOST_BLAS_THREADS=N fixes the count at N during host calls (never raising a
// library's own setting); =unlimited leaves the libraries alone (see
// jaxbridge/_foreign/threads.py).
#include <algorithm>
#include <mutex>
#include <thread>

#include "internal.h"

namespace jaxbridge::hostcall {
namespace {

constexpr int kProbeCalls = 3;     // calls of the other choice when probing again
constexpr int kProbesToSwitch = 2;  // probes in a row that must find the other faster,
constexpr double kClearWin = 1.5;   // unless one finds it this much faster
constexpr double kProbeSeconds = 2.0;  // how often the other choice is tried again
constexpr double kThreadsMustWinBy = 1.05;  // every thread is chosen when this much faster

struct BlasLibrary {
  int (*get)() = nullptr;
  void (*set)(int) = nullptr;
  int own = 0;  // its thread count outside host calls (read when the first call starts)
};

struct Budgets {
  std::mutex mu;
  ThreadPolicy policy = ThreadPolicy::kAuto;
  int limit = 0;   // kFixed
  int active = 0;  // host calls running now
  int applied = 0;  // the count set on the libraries now (0: their own)
  std::vector<BlasLibrary> libraries;
  int own = 0;     // the largest of the libraries' own counts (or the cores')
};
Budgets& TheBudgets() {
  static auto* budgets = new Budgets();
  return *budgets;
}

thread_local int t_budget = 0;  // this thread's call's budget (0: the libraries' own)

template <size_t N>
double Median(const std::array<double, N>& v, int n) {
  std::array<double, N> s = v;
  std::sort(s.begin(), s.begin() + n);
  return s[n / 2];
}

// Set every library to `count` threads (0: back to its own), never above its own count.
void Apply(Budgets& b, int count) {
  if (count == b.applied) return;
  for (BlasLibrary& lib : b.libraries) {
    int want = count == 0 ? lib.own : std::min(count, lib.own);
    if (lib.get() != want) lib.set(want);
  }
  b.applied = count;
}

}  // namespace

// ------------------------------------------------------------------ ThreadTuner
void ThreadTuner::StartRound(Phase phase) {
  phase_ = phase;
  measured_ = 0;
  if (phase == Phase::kProbe) {
    next_[1 - chosen_] = 0;  // the other choice's samples: this probe's only
  } else if (phase == Phase::kExploit) {
    next_[chosen_] = 0;  // the chosen one's: the calls since
  }
}

int ThreadTuner::Choose(int share) {
  if (share <= 1) return 1;
  if (phase_ == Phase::kExploit &&
      std::chrono::duration<double>(Clock::now() - decided_at_).count() >= kProbeSeconds &&
      next_[chosen_] >= kSamples) {
    StartRound(Phase::kProbe);
  }
  switch (phase_) {
    case Phase::kExplore:  // alternate, one thread second
      arm_ = measured_ % 2 == 0 ? kShare : kOne;
      break;
    case Phase::kProbe:  // the other choice, kProbeCalls calls in a row
      arm_ = 1 - chosen_;
      break;
    case Phase::kExploit:
      arm_ = chosen_;
      break;
  }
  return arm_ == kOne ? 1 : share;
}

void ThreadTuner::Record(double seconds) {
  if (arm_ < 0) return;  // no choice was made (shared or fixed budget)
  if (!warm_) {  // the function's first call: slower whatever its threads
    warm_ = true;
    arm_ = -1;
    return;
  }
  samples_[arm_][next_[arm_]++ % kSamples] = seconds;  // (a ring: the latest kSamples)
  arm_ = -1;
  if (phase_ == Phase::kExploit) return;
  int round = phase_ == Phase::kExplore ? 2 * kSamples : kProbeCalls;
  if (++measured_ < round) return;
  // Only recent samples are compared (the machine's speed moves by tens of percent
  // within seconds): exploring, the two alternated; probing, the other choice's calls
  // just now against the chosen one's last calls before them, each in its steady state
  // (a choice's cost can depend on the calls around it: torch's pool resized between a
  // forward and a backward that run with different counts).
  double one = Median(samples_[kOne], std::min(next_[kOne], kSamples));
  double share = Median(samples_[kShare], std::min(next_[kShare], kSamples));
  int faster = share * kThreadsMustWinBy < one ? kShare : kOne;
  if (phase_ == Phase::kExplore) {
    chosen_ = faster;
  } else if (faster == chosen_) {
    doubts_ = 0;
  } else if ((faster == kShare ? one / share : share / one) >= kClearWin ||
             ++doubts_ >= kProbesToSwitch) {  // one probe switches only on a clear win
    chosen_ = faster;
    doubts_ = 0;
  }
  StartRound(Phase::kExploit);
  decided_at_ = Clock::now();
}

py::dict ThreadTuner::State() const {
  py::dict d;
  d["phase"] = phase_ == Phase::kExplore ? "explore"
               : phase_ == Phase::kProbe ? "probe" : "exploit";
  d["chosen"] = phase_ == Phase::kExplore ? py::object(py::none())
                : py::object(py::str(chosen_ == kOne ? "one" : "share"));
  return d;
}

// ------------------------------------------------------------------ ThreadBudget
ThreadBudget::ThreadBudget(Entry* entry) {
  Budgets& b = TheBudgets();
  if (b.policy == ThreadPolicy::kLeave) return;
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.active++ == 0) {
    b.own = 0;
    for (BlasLibrary& lib : b.libraries) {
      lib.own = lib.get();
      b.own = std::max(b.own, lib.own);
    }
    if (b.own == 0) b.own = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    b.applied = 0;
  }
  int budget;
  if (b.policy == ThreadPolicy::kFixed) {
    budget = b.limit;
  } else {
    int concurrent = std::max(b.active, entry ? entry->concurrency : 1);
    int share = std::max(1, b.own / concurrent);
    budget = (concurrent == 1 && entry != nullptr) ? entry->tuner.Choose(share) : share;
    tuner_ = concurrent == 1 ? entry : nullptr;
  }
  // Process-wide: with calls running at once the smallest budget holds for all.
  Apply(b, b.applied == 0 ? budget : std::min(b.applied, budget));
  t_budget = budget;
  engaged_ = true;
  started_ = Clock::now();
}

ThreadBudget::~ThreadBudget() {
  if (!engaged_) return;
  double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  if (tuner_ != nullptr) tuner_->tuner.Record(seconds);  // the GIL is still held
  Budgets& b = TheBudgets();
  std::lock_guard<std::mutex> lock(b.mu);
  if (--b.active == 0) Apply(b, 0);
  t_budget = 0;
}

int CurrentThreadBudget() { return t_budget; }

bool SetThreadPolicy(ThreadPolicy policy, int limit,
                     const std::vector<std::pair<uintptr_t, uintptr_t>>& fns) {
  Budgets& b = TheBudgets();
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.active != 0) return false;  // host calls are running: try again later
  b.policy = policy;
  b.limit = std::max(1, limit);
  b.libraries.clear();
  for (const auto& [get, set] : fns) {
    BlasLibrary lib;
    lib.get = reinterpret_cast<int (*)()>(get);
    lib.set = reinterpret_cast<void (*)(int)>(set);
    b.libraries.push_back(lib);
  }
  return true;
}

}  // namespace jaxbridge::hostcall
