// cuda_emu.h -- the CUDA kernels of backends/cuda/, unchanged, on the CPU (g++, C++17).
//
// Included before a .cu source, this header gives the CUDA C++ the kernels use a host
// meaning, so that every launch runs the real kernel code on a CPU, and checks what a GPU
// leaves undefined:
//
// * one execution context per CUDA thread: a ucontext fiber (the default; all fibers of a
//   block share one OS thread and switch only at barriers) or, with -DEMU_THREADS, one OS
//   thread (what ThreadSanitizer needs to see the races a missing barrier leaves);
// * the blocks of a grid run one after another, in reverse order (so a block that writes
//   into its successor's rows is seen: the successor has already run), or shuffled with
//   EMU_SEED;
// * a block's shared arrays (ER_SHARED_ARRAY, entmax_teams.cuh) are the emulator's: filled
//   with NaN bytes (0xff) when the block first reaches the declaration, every index checked
//   against the array's size, and every element shadowed by its last writer and readers
//   since the last __syncthreads(): a thread that reads an element another thread wrote, or
//   writes one another thread read or wrote, with no barrier of the block between them, is
//   a race and fails the launch, whatever order the threads happen to run in;
// * an access outside the memory the kernel was given (the CuPy stand-in ends every device
//   array at an inaccessible page) fails the launch with the address instead of crashing;
// * __syncthreads() is a barrier of the block, every __shfl_*_sync a barrier of the warp
//   over a two-slot exchange; a barrier that only part of its group reaches, threads of
//   one group at different barriers, or a partial shuffle mask aborts the launch and
//   names the call site (on a GPU these are undefined behaviour or a hang);
// * atomicExch / atomicAdd / atomicCAS are GCC atomics.
//
// Fiber mode with EMU_SEED set (environment, a non-zero integer) runs the fibers of a
// block in a shuffled order at every sweep, and the blocks in a shuffled order, so code
// that depends on which thread or block gets to a point first gives different answers
// under different seeds.
//
// What it does not model: blocks running at the same time (no races between blocks),
// the device math library's rounding (glibc's libm answers instead), cuBLAS, timing.
//
// EMU_EXPORT(kernel<T>, ...) after the source builds the extern "C" table that
// tests/cuda_emu/launcher.py launches by name expression (cuLaunchKernel's convention:
// an array of pointers to the arguments), with each parameter's size and kind.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <memory>
#include <mutex>
#include <random>
#include <setjmp.h>
#include <string>
#include <thread>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>
#ifndef EMU_THREADS
#ifdef _FORTIFY_SOURCE  // its longjmp check refuses a jump to another stack (a fiber's)
#undef _FORTIFY_SOURCE
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EMU_SANITIZED 1  // the sanitizer's own SIGSEGV handler reports faults
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// The launch bound of each kernel is read from the preprocessed source by the build step
// (tests/cuda_emu/build.py defines EMU_SCAN_BOUNDS for that pass) and enforced by the
// launcher; the compiled code ignores it.
#ifdef EMU_SCAN_BOUNDS
#define __launch_bounds__(...) EMU_LAUNCH_BOUNDS(__VA_ARGS__)
#else
#define __launch_bounds__(...)
#endif
// Shared memory is declared with ER_SHARED_ARRAY (below), which the emulator checks; a bare
// __shared__ would be a function-local static it cannot see into.
#define __shared__ static_assert(false, "declare shared memory with ER_SHARED_ARRAY (entmax_teams.cuh)");

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {
constexpr int WARP = 32;
constexpr int MAX_THREADS = 1024;

// Thrown inside a CUDA thread to unwind it once the launch has failed.
struct Abort {};

// The launch's state: its first error (with the call site) and whether it failed.
struct LaunchState {
    std::mutex mu;
    std::string error;
    std::atomic<bool> failed{false};
    double timeout_s = 60.0;  // thread mode: a barrier nobody completes within this is a deadlock

    void set_error(const std::string& what) {
        std::lock_guard<std::mutex> g(mu);
        if (error.empty()) error = what;
        failed = true;
    }
};
inline LaunchState state;

[[noreturn]] inline void fail(const std::string& what, const char* file, int line) {
    state.set_error(std::string(file) + ":" + std::to_string(line) + ": " + what);
    throw Abort{};
}

#ifndef EMU_THREADS
inline void yield_to_scheduler();
inline unsigned long long progress = 0;  // barrier arrivals and thread exits, for deadlock detection
#endif

// A barrier of `size` CUDA threads that also checks that they all wait at one call site.
// Its generation (completed waits) is the epoch of the shared-memory race check.
class Barrier {
   public:
    void reset(int size) {
        size_ = size;
        arrived_ = exited_ = 0;
        generation_ = 0;
    }

    unsigned generation() const { return generation_.load(std::memory_order_acquire); }

    void wait(const char* file, int line) {
#ifdef EMU_THREADS
        std::unique_lock<std::mutex> lock(mu_);
#endif
        if (state.failed) throw Abort{};
        if (exited_ > 0) fail("a barrier reached after another thread of its group returned", file, line);
        if (arrived_ == 0) {
            file_ = file;
            line_ = line;
        } else if (line_ != line || std::strcmp(file_, file) != 0) {
            fail("threads of one group wait at different barriers (the other: " + std::string(file_) + ":" +
                     std::to_string(line_) + ")",
                 file, line);
        }
        const unsigned generation = generation_;
        if (++arrived_ == size_) {
            arrived_ = 0;
            generation_.fetch_add(1, std::memory_order_acq_rel);
        }
#ifdef EMU_THREADS
        if (generation_ != generation) {
            cv_.notify_all();
            return;
        }
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(state.timeout_s);
        while (generation_ == generation) {
            if (state.failed) throw Abort{};
            if (cv_.wait_until(lock, until) == std::cv_status::timeout && generation_ == generation) {
                lock.unlock();
                fail("deadlock: a barrier not completed within the timeout", file, line);
            }
        }
#else
        ++progress;
        do {  // the releasing fiber yields too, so that any of them may run next
            yield_to_scheduler();
            if (state.failed) throw Abort{};
        } while (generation_ == generation);
#endif
    }

    // A thread of the group returned: the others must not wait here for it.
    void leave() {
#ifdef EMU_THREADS
        std::lock_guard<std::mutex> lock(mu_);
#endif
        ++exited_;
        if (arrived_ > 0)
            state.set_error(std::string(file_) + ":" + std::to_string(line_) +
                            ": a thread of the group returned while others wait at this barrier");
#ifdef EMU_THREADS
        cv_.notify_all();
#endif
    }

    void wake_all() {
#ifdef EMU_THREADS
        std::lock_guard<std::mutex> lock(mu_);
        cv_.notify_all();
#endif
    }

   private:
    int size_ = 0, arrived_ = 0, exited_ = 0;
    std::atomic<unsigned> generation_{0};
    const char* file_ = "";
    int line_ = 0;
#ifdef EMU_THREADS
    std::mutex mu_;
    std::condition_variable cv_;
#endif
};

// A warp's barrier and its two exchange slots (alternating shuffles use alternating
// slots, so a lane may write the next one while a slow lane still reads this one).
struct Warp {
    Barrier barrier;
    int size = WARP;
    uint64_t slot[2][WARP];
};

// A shared array of a block, as the block's threads see it: any type with a virtual
// destructor, so that the block can own arrays of every element type and size.
struct SharedBase {
    virtual ~SharedBase() = default;
};

struct Block {
    Barrier barrier;
    std::vector<std::unique_ptr<Warp>> warps;
    dim3 index;
    std::mutex shared_mu;
    std::vector<std::unique_ptr<SharedBase>> shared;  // by declaration site, created on first use
};

// What a CUDA thread sees: its indices, its block, which exchange slot is next, and where
// a memory fault in it resumes.
struct ThreadContext {
    dim3 thread;
    Block* block = nullptr;
    int slot = 0;
    sigjmp_buf* fault = nullptr;
};
inline thread_local ThreadContext here;
inline dim3 block_dim, grid_dim;

inline int linear_thread() { return (int)(here.thread.x + block_dim.x * (here.thread.y + block_dim.y * here.thread.z)); }

inline void syncthreads(const char* file, int line) { here.block->barrier.wait(file, line); }

// ------------------------------------------------------------------ shared arrays
// One shared array of a block: its elements, and for each element the thread that last
// wrote it and the thread(s) that read it, with the barrier epoch (the block's completed
// __syncthreads()) of each.  Indexing gives a reference object, so that every read and
// write is seen; a kernel cannot take the array's address or decay it to a pointer.
template <class T, int N>
class SharedArray : public SharedBase {
   public:
    SharedArray(const char* name, const char* file, int line) : name_(name), file_(file), line_(line) {
        std::memset(static_cast<void*>(data_), 0xff, sizeof data_);  // NaN as float and double
    }

    class Ref {
       public:
        Ref(SharedArray* a, long long i) : a_(a), i_(i) {}
        operator T() const { return a_->access(i_, nullptr); }
        Ref& operator=(T v) {
            a_->access(i_, &v);
            return *this;
        }
        Ref& operator=(const Ref& o) { return *this = T(o); }
        Ref& operator+=(T v) { return *this = T(*this) + v; }
        Ref& operator-=(T v) { return *this = T(*this) - v; }
        Ref& operator*=(T v) { return *this = T(*this) * v; }

       private:
        SharedArray* a_;
        long long i_;
    };

    Ref operator[](long long i) {
        if (i < 0 || i >= N)
            fail("shared array '" + std::string(name_) + "' of " + std::to_string(N) + " elements indexed at " +
                     std::to_string(i) + " by thread " + std::to_string(linear_thread()),
                 file_, line_);
        return Ref(this, i);
    }

   private:
    struct Shadow {
        int writer = -1, reader = -1;  // reader -2: several threads
        unsigned written = ~0u, read = ~0u;
    };

    [[noreturn]] void race(long long i, const char* what, int other) {
        fail("a race on shared array '" + std::string(name_) + "' element " + std::to_string(i) + ": thread " +
                 std::to_string(linear_thread()) + " " + what + " " +
                 (other == -2 ? std::string("other threads") : "thread " + std::to_string(other)) +
                 " with no __syncthreads() between them",
             file_, line_);
    }

    // A read (value null) or a write of element i, checked against its shadow: the thread
    // that last wrote it, the thread(s) that read it, and the barrier epoch of each.
    T access(long long i, const T* value) {
#ifdef EMU_THREADS
        std::lock_guard<std::mutex> lock(mu_);
#endif
        const int t = linear_thread();
        const unsigned e = here.block->barrier.generation();
        Shadow& s = shadow_[i];
        if (s.written == e && s.writer != t)
            race(i, value ? "overwrites the value written by" : "reads the value written by", s.writer);
        if (value != nullptr) {
            if (s.read == e && s.reader != t) race(i, "overwrites the value read by", s.reader);
            s.writer = t;
            s.written = e;
            data_[i] = *value;
        } else if (s.read != e) {
            s.read = e;
            s.reader = t;
        } else if (s.reader != t) {
            s.reader = -2;
        }
        return data_[i];
    }

    T data_[N];
    Shadow shadow_[N];
    const char* name_;
    const char* file_;
    int line_;
#ifdef EMU_THREADS
    std::mutex mu_;
#endif
};

inline int next_shared_site() {
    static std::atomic<int> sites{0};
    return sites++;
}

// The block's shared array declared at one site (Site: a type unique to the declaration).
template <class T, int N, class Site>
SharedArray<T, N>& shared_array(const char* name, const char* file, int line, Site) {
    static const int site = next_shared_site();
    Block& blk = *here.block;
    std::lock_guard<std::mutex> lock(blk.shared_mu);
    if ((int)blk.shared.size() <= site) blk.shared.resize(site + 1);
    if (!blk.shared[site]) blk.shared[site].reset(new SharedArray<T, N>(name, file, line));
    return static_cast<SharedArray<T, N>&>(*blk.shared[site]);
}

// ------------------------------------------------------------------ warps and atomics
// Lane l receives the value of lane source(l); every lane of the warp must take part.
template <class T, class Source>
T shuffle(unsigned mask, T value, Source source, const char* file, int line) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle of more than 8 bytes");
    const int tid = linear_thread(), lane = tid % WARP;
    Warp& w = *here.block->warps[tid / WARP];
    const unsigned whole = w.size == WARP ? 0xffffffffu : ((1u << w.size) - 1u);
    if (mask != whole) fail("a shuffle mask that is not the whole warp (not emulated)", file, line);
    const int s = here.slot;
    here.slot ^= 1;
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    w.slot[s][lane] = bits;
    w.barrier.wait(file, line);
    const int from = source(lane);
    if (from < 0 || from >= w.size) return value;  // out of the warp: the lane keeps its value
    T r;
    bits = w.slot[s][from];
    std::memcpy(&r, &bits, sizeof(T));
    return r;
}

template <class T>
T atomic_exch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }

template <class T>
T atomic_cas(T* a, T expected, T v) {
    __atomic_compare_exchange_n(a, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}

template <class T>
T atomic_add(T* a, T v) {
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
    } else {  // floating point: compare-and-swap on the bits
        using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
        Bits* p = reinterpret_cast<Bits*>(a);
        Bits old = __atomic_load_n(p, __ATOMIC_SEQ_CST), sum_bits;
        T o;
        do {
            std::memcpy(&o, &old, sizeof(T));
            const T sum = o + v;
            std::memcpy(&sum_bits, &sum, sizeof(T));
        } while (!__atomic_compare_exchange_n(p, &old, sum_bits, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
        return o;
    }
}

// ------------------------------------------------------------------ memory faults
// During a launch a SIGSEGV in a CUDA thread (a read or write past the end of a device
// array, which the CuPy stand-in ends at an inaccessible page) ends that thread and fails
// the launch with the address; one anywhere else goes to the handler that was there before.
inline std::atomic<uintptr_t> fault_address{0};
inline std::atomic<int> fault_write{-1};  // 1 a write, 0 a read, -1 unknown
inline struct sigaction previous_segv;

inline void on_segv(int sig, siginfo_t* info, void* context) {
    if (here.fault == nullptr) {  // not in a kernel: as if this handler were not there
        sigaction(SIGSEGV, &previous_segv, nullptr);
        return;  // the access faults again, under the previous handler
    }
    fault_address = (uintptr_t)info->si_addr;
#if defined(__x86_64__)
    fault_write = (static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 0;
#else
    (void)context;
#endif
    (void)sig;
    siglongjmp(*here.fault, 1);
}

inline std::string fault_message() {
    char text[160];
    const int w = fault_write.load();
    std::snprintf(text, sizeof text, "%s address 0x%llx, outside the memory the kernel was given",
                  w == 1 ? "a write to" : w == 0 ? "a read of" : "an access to",
                  (unsigned long long)fault_address.load());
    return text;
}

// ------------------------------------------------------------------ running a block
inline dim3 thread_index(int t, dim3 block) {
    return dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
}

// The body of CUDA thread t: run the kernel, then leave the barriers it belongs to.
template <class Kernel>
void run_thread(Block& blk, int t, const Kernel& kernel) {
    sigjmp_buf fault;
    here.fault = &fault;
    if (sigsetjmp(fault, 0) == 0) {
        try {
            kernel();
        } catch (Abort&) {
        }
    } else {
        state.set_error("thread " + std::to_string(t) + ": " + fault_message());
    }
    here.fault = nullptr;
    blk.warps[t / WARP]->barrier.leave();
    blk.barrier.leave();
}

#ifndef EMU_THREADS
// Fiber mode: the block's threads are fibers that the scheduler sweeps, in order or
// shuffled, until every one has returned.  A fiber starts on its own stack with
// makecontext/setcontext; after that, switches are _setjmp/_longjmp, which (unlike
// swapcontext) make no system call to save the signal mask.
struct Fiber {
    ucontext_t context;
    jmp_buf resume;
    std::vector<char> stack;
    ThreadContext saved;
    bool started = false, done = false;
};
constexpr size_t FIBER_STACK = 1 << 17;
inline std::vector<Fiber> fibers;
inline jmp_buf scheduler;
inline Fiber* running = nullptr;
inline void (*block_body)(const void*, int) = nullptr;  // the block's run_thread, type-erased
inline const void* block_body_context = nullptr;

inline void yield_to_scheduler() {
    running->saved = here;
    if (!_setjmp(running->resume)) _longjmp(scheduler, 1);
}

[[noreturn]] inline void fiber_entry(int t) {
    block_body(block_body_context, t);
    running->done = true;
    ++progress;
    _longjmp(scheduler, 1);  // a fiber never returns from its entry function
}

inline void switch_to(Fiber& f) {
    running = &f;
    here = f.saved;
    if (_setjmp(scheduler)) return;  // the fiber yielded or finished
    if (!f.started) {
        f.started = true;
        setcontext(&f.context);
    }
    _longjmp(f.resume, 1);
}

template <class Kernel>
struct BlockBody {
    Block* block;
    const Kernel* kernel;
    static void call(const void* self, int t) {
        const BlockBody* b = static_cast<const BlockBody*>(self);
        run_thread(*b->block, t, *b->kernel);
    }
};

template <class Kernel>
bool run_block(Block& blk, int nthreads, dim3 block, const Kernel& kernel, unsigned long long seed) {
    const BlockBody<Kernel> body{&blk, &kernel};
    block_body = &BlockBody<Kernel>::call;
    block_body_context = &body;
    if ((int)fibers.size() < nthreads) fibers.resize(nthreads);
    for (int t = 0; t < nthreads; ++t) {
        Fiber& f = fibers[t];
        f.stack.resize(FIBER_STACK);
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.data();
        f.context.uc_stack.ss_size = f.stack.size();
        f.context.uc_link = nullptr;
        makecontext(&f.context, (void (*)())fiber_entry, 1, t);
        f.saved.thread = thread_index(t, block);
        f.saved.block = &blk;
        f.saved.slot = 0;
        f.saved.fault = nullptr;
        f.started = f.done = false;
    }
    std::vector<int> order(nthreads);
    for (int t = 0; t < nthreads; ++t) order[t] = t;
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + blk.index.x + 1);
    for (int alive = nthreads; alive > 0;) {
        if (seed) std::shuffle(order.begin(), order.end(), rng);
        const unsigned long long before = progress;
        alive = 0;
        for (int t : order) {
            Fiber& f = fibers[t];
            if (f.done) continue;
            switch_to(f);
            alive += !f.done;
        }
        if (alive > 0 && progress == before && !state.failed)
            state.set_error("deadlock: every live thread waits at a barrier that cannot complete");
    }
    return !state.failed;
}
#else
template <class Kernel>
bool run_block(Block& blk, int nthreads, dim3 block, const Kernel& kernel, unsigned long long) {
    std::vector<std::thread> threads;
    threads.reserve(nthreads);
    for (int t = 0; t < nthreads; ++t)
        threads.emplace_back([&, t] {
            here.thread = thread_index(t, block);
            here.block = &blk;
            here.slot = 0;
            run_thread(blk, t, kernel);
            if (state.failed) {  // wake every waiter so that it unwinds
                blk.barrier.wake_all();
                for (auto& w : blk.warps) w->barrier.wake_all();
            }
        });
    for (auto& th : threads) th.join();
    return !state.failed;
}
#endif

// While a launch runs: SIGSEGV in a CUDA thread fails the launch (on_segv).
struct FaultHandler {
#ifndef EMU_SANITIZED
    FaultHandler() {
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &previous_segv);
    }
    ~FaultHandler() { sigaction(SIGSEGV, &previous_segv, nullptr); }
#endif
};

// kernel<<<grid, block>>>(args...): 0, or 1 with the reason in state.error.
template <class... P, class... A>
int launch(dim3 grid, dim3 block, void (*kernel)(P...), A... args) {
    static_assert(sizeof...(P) == sizeof...(A), "argument count");
    const long long nthreads = (long long)block.x * block.y * block.z;
    state.error.clear();
    state.failed = false;
    fault_write = -1;
    if (nthreads < 1 || nthreads > MAX_THREADS) {
        state.set_error("blockDim of " + std::to_string(nthreads) + " threads (1 to 1024 exist)");
        return 1;
    }
    block_dim = block;
    grid_dim = grid;
    const char* env = std::getenv("EMU_SEED");
    const unsigned long long seed = env ? std::strtoull(env, nullptr, 10) : 0;
    // the blocks in reverse order, or shuffled by the seed
    std::vector<dim3> blocks;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) blocks.emplace_back(bx, by, bz);
    std::reverse(blocks.begin(), blocks.end());
    if (seed) std::shuffle(blocks.begin(), blocks.end(), std::mt19937_64(seed));
    FaultHandler handler;
    auto body = [&] { kernel(P(args)...); };
    for (const dim3& index : blocks) {
        Block blk;
        blk.index = index;
        blk.barrier.reset((int)nthreads);
        for (long long w = 0; w * WARP < nthreads; ++w) {
            blk.warps.emplace_back(new Warp);
            const int left = (int)nthreads - (int)w * WARP;
            blk.warps.back()->size = left < WARP ? left : WARP;
            blk.warps.back()->barrier.reset(blk.warps.back()->size);
        }
        if (!run_block(blk, (int)nthreads, block, body, seed)) return 1;
    }
    return 0;
}

// A parameter's kind: p pointer, f floating point, i signed integer, u unsigned, b bool,
// s a record (a struct passed by value).
template <class T>
constexpr char kind() {
    return std::is_pointer<T>::value                ? 'p'
           : std::is_same<T, bool>::value           ? 'b'
           : std::is_floating_point<T>::value       ? 'f'
           : std::is_class<T>::value                ? 's'
           : std::is_signed<T>::value               ? 'i'
                                                    : 'u';
}

constexpr int MAX_PARAMS = 40;

// One exported kernel: its name expression, its parameters, and how to launch it from
// cuLaunchKernel-style arguments.
struct Entry {
    const char* name;
    void (*fn)();
    int (*launch)(void (*)(), dim3, dim3, void**);
    int nparams;
    size_t sizes[MAX_PARAMS];
    char kinds[MAX_PARAMS];
};

template <class... P, size_t... I>
int launch_from_pointers(void (*fn)(), dim3 g, dim3 b, void** params, std::index_sequence<I...>) {
    auto kernel = reinterpret_cast<void (*)(P...)>(fn);
    return launch(g, b, kernel, *static_cast<std::remove_cv_t<P>*>(params[I])...);
}

template <class... P>
Entry entry(const char* name, void (*kernel)(P...)) {
    static_assert(sizeof...(P) <= MAX_PARAMS, "more kernel parameters than the table holds");
    return Entry{name,
                 reinterpret_cast<void (*)()>(kernel),
                 [](void (*fn)(), dim3 g, dim3 b, void** params) {
                     return launch_from_pointers<P...>(fn, g, b, params, std::index_sequence_for<P...>{});
                 },
                 (int)sizeof...(P),
                 {sizeof(P)...},
                 {kind<P>()...}};
}
}  // namespace emu

// What entmax_teams.cuh declares shared memory with: emu::SharedArray (see above), one per
// block and declaration site.
#define ER_SHARED_ARRAY(T, N, name) \
    emu::SharedArray<T, N>& name = emu::shared_array<T, N>(#name, __FILE__, __LINE__, [] {})
namespace er {
template <class T, int N>
using SharedArray = emu::SharedArray<T, N>;
}  // namespace er

#define threadIdx (emu::here.thread)
#define blockIdx (emu::here.block->index)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define warpSize 32
#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)
#define __shfl_sync(m, v, src, ...) emu::shuffle((m), (v), [&](int) { return (int)(src); }, __FILE__, __LINE__)
#define __shfl_xor_sync(m, v, x, ...) emu::shuffle((m), (v), [&](int l) { return l ^ (int)(x); }, __FILE__, __LINE__)
#define __shfl_down_sync(m, v, d, ...) emu::shuffle((m), (v), [&](int l) { return l + (int)(d); }, __FILE__, __LINE__)
#define __shfl_up_sync(m, v, d, ...) emu::shuffle((m), (v), [&](int l) { return l - (int)(d); }, __FILE__, __LINE__)
#define atomicExch(a, v) emu::atomic_exch((a), (v))
#define atomicAdd(a, v) emu::atomic_add((a), (v))
#define atomicCAS(a, c, v) emu::atomic_cas((a), (c), (v))

#define EMU_KERNEL(expr) emu::entry(#expr, &expr)
#define EMU_EXPORT(...)                                                                                     \
    static const emu::Entry emu_table[] = {__VA_ARGS__};                                                     \
    extern "C" int emu_count() { return (int)(sizeof emu_table / sizeof emu_table[0]); }                     \
    extern "C" const emu::Entry* emu_entry(int i) { return &emu_table[i]; }                                 \
    extern "C" const char* emu_error() { return emu::state.error.c_str(); }                                 \
    extern "C" int emu_launch(int i, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,        \
                              unsigned bz, void** params) {                                                  \
        return emu_table[i].launch(emu_table[i].fn, dim3(gx, gy, gz), dim3(bx, by, bz), params);             \
    }
