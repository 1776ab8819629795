/* The CUDA emulator's execution model (see cuda_emu.h): a launch runs its
 * blocks one after another, each CUDA thread of a block a fiber with its own
 * stack, switched cooperatively at barriers. */
#include "device/cuda/emu/cuda_emu.h"
#include "device/cuda/emu/cuda_emu_internal.h"

#include <cxxabi.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <mutex>
#include <string>
#include <vector>

/* x86-64 switches fibers with a few instructions of its own; elsewhere (or
 * with -DAT_EMU_UCONTEXT) ucontext, whose every switch is a system call. */
#if defined(__x86_64__) && !defined(AT_EMU_UCONTEXT)
#define AT_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

/* ------------------------------------------------------------------------ */
/* fibers                                                                     */
/* ------------------------------------------------------------------------ */

enum { F_RUNNABLE, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE, F_FAILED };

static const size_t STACK_SIZE = 128 * 1024;

struct fiber {
    uint3 tid;
    int warp, lane;
    int state;
    unsigned char *stack;
#ifdef AT_EMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
};

/* The state of the running block. */
struct block_state {
    int nthreads, live;
    int block_arrived;
    int sync_acc, sync_result, sync_n; /* __syncthreads_count / _and / _or: sum of predicates, arrivals */
    std::vector<int> warp_arrived, warp_size, warp_kind;
    std::vector<uint64_t> warp_slots, warp_result;
    std::vector<float> wmma_in, wmma_out; /* per warp: the a, b, c tiles of mma_sync (3 × 256), d (256) */
    bool failed;
};

AT_EMU_HIDDEN const uint3 *at_emu_thread_idx;
AT_EMU_HIDDEN at_emu_coords at_emu_launch_coords;

static std::vector<fiber *> g_fibers;
static fiber *g_cur; /* the running fiber; NULL on the scheduler */
static block_state g_blk;
static void (*g_body)(void *);
static void *g_arg;
static unsigned char *g_dyn_shared;
static std::string g_kernel_name;

#ifdef AT_EMU_ASM_SWITCH
/* at_emu_switch(save, load): saves the callee-saved registers and the FPU
 * control words on the current stack, stores its pointer in *save, and
 * continues on the stack `load` (made by this function or by new_frame). */
extern "C" void at_emu_switch(void **save, void *load);
__asm__(".pushsection .text\n"
        ".globl at_emu_switch\n"
        ".hidden at_emu_switch\n"
        ".type at_emu_switch,@function\n"
        "at_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size at_emu_switch,.-at_emu_switch\n"
        ".popsection\n");
static void *g_sched_sp;
#else
static ucontext_t g_sched_uc;
#endif

static void fiber_main(void);

/* Gives f a fresh stack frame that starts fiber_main. */
static void new_frame(fiber *f)
{
#ifdef AT_EMU_ASM_SWITCH
    uintptr_t top = ((uintptr_t)f->stack + STACK_SIZE) & ~(uintptr_t)15;
    uint64_t *s = (uint64_t *)top;
    /* from the top: a null return address for fiber_main, its entry (the
     * `ret` of at_emu_switch, leaving rsp ≡ 8 mod 16 as after a call), six
     * zeroed registers, then the MXCSR / x87 control words of this thread */
    s[-1] = 0;
    s[-2] = (uint64_t)(uintptr_t)&fiber_main;
    for (int i = 3; i <= 8; i++) s[-i] = 0;
    uint32_t mx;
    uint16_t cw;
    __asm__ volatile("stmxcsr %0" : "=m"(mx));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    uint64_t ctl = (uint64_t)mx | ((uint64_t)cw << 32);
    s[-9] = ctl;
    f->sp = &s[-9];
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK_SIZE;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, fiber_main, 0);
#endif
}

/* Back to the scheduler; returns when the scheduler resumes f. The other
 * fibers ran meanwhile: the memory clobber keeps the compiler from carrying
 * values of shared state across the switch. */
static void park(fiber *f)
{
#ifdef AT_EMU_ASM_SWITCH
    at_emu_switch(&f->sp, g_sched_sp);
#else
    swapcontext(&f->uc, &g_sched_uc);
#endif
    __asm__ volatile("" ::: "memory");
}

static void resume(fiber *f)
{
    g_cur = f;
    at_emu_thread_idx = &f->tid;
#ifdef AT_EMU_ASM_SWITCH
    at_emu_switch(&g_sched_sp, f->sp);
#else
    swapcontext(&g_sched_uc, &f->uc);
#endif
    __asm__ volatile("" ::: "memory");
    g_cur = NULL;
}

static bool grow_fibers(size_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    while (g_fibers.size() < n) {
        void *m = mmap(NULL, STACK_SIZE + (size_t)page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, (size_t)page, PROT_NONE); /* a stack overflow faults instead of corrupting a neighbour */
        fiber *f = new fiber();
        f->stack = (unsigned char *)m + page;
        new_frame(f);
        g_fibers.push_back(f);
    }
    return true;
}

/* Releases the block barrier: every fiber waiting there runs again. */
static void release_block(void)
{
    for (int i = 0; i < g_blk.nthreads; i++)
        if (g_fibers[i]->state == F_WAIT_BLOCK) g_fibers[i]->state = F_RUNNABLE;
    g_blk.sync_n = g_blk.block_arrived;
    g_blk.block_arrived = 0;
    g_blk.sync_result = g_blk.sync_acc;
    g_blk.sync_acc = 0;
}

static void fiber_main(void)
{
    for (;;) {
        fiber *f = g_cur;
        g_body(g_arg);
        f->state = F_DONE;
        g_blk.live--;
        /* an exited thread no longer holds up __syncthreads */
        if (g_blk.block_arrived > 0 && g_blk.block_arrived == g_blk.live) release_block();
        park(f);
    }
}

/* Fails the launch from inside a kernel; the fiber never runs again. */
__attribute__((format(printf, 1, 2))) static void kernel_fail(const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fiber *f = g_cur;
    at_emu_fail(cudaErrorLaunchFailure, "kernel launched by %s, block (%u,%u,%u), thread (%u,%u,%u): %s",
         g_kernel_name.c_str(), at_emu_launch_coords.block_idx.x, at_emu_launch_coords.block_idx.y,
         at_emu_launch_coords.block_idx.z, f->tid.x, f->tid.y, f->tid.z, msg);
    g_blk.failed = true;
    f->state = F_FAILED;
    park(f);
}

/* __syncthreads with a predicate: returns how many threads passed a nonzero
 * one (*n: how many arrived). */
static int sync_block(int pred, int *n)
{
    fiber *f = g_cur;
    *n = 1;
    if (!f) return pred != 0; /* outside a kernel: nothing to wait for */
    g_blk.sync_acc += pred != 0;
    if (++g_blk.block_arrived == g_blk.live) release_block();
    else {
        f->state = F_WAIT_BLOCK;
        park(f);
    }
    /* the result stays until the next release, which needs this thread again */
    *n = g_blk.sync_n;
    return g_blk.sync_result;
}

void __syncthreads()
{
    int n;
    sync_block(0, &n);
}
int __syncthreads_count(int p)
{
    int n;
    return sync_block(p, &n);
}
int __syncthreads_and(int p)
{
    int n, c = sync_block(p, &n);
    return c == n;
}
int __syncthreads_or(int p)
{
    int n;
    return sync_block(p, &n) != 0;
}

enum { KIND_WMMA_LOAD = 10, KIND_WMMA_STORE = 11, KIND_MMA = 12 };

/* d = a·b + c of warp w's published tiles, in double, rounded once. */
static void wmma_compute(int w)
{
    const float *a = &g_blk.wmma_in[(size_t)w * 768], *b = a + 256, *c = a + 512;
    float *d = &g_blk.wmma_out[(size_t)w * 256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            double s = c[r * 16 + n];
            for (int k = 0; k < 16; k++) s += (double)a[r * 16 + k] * b[k * 16 + n];
            d[r * 16 + n] = (float)s;
        }
}

/* The barrier of the warp of f; kind names the operation so that lanes
 * meeting at different warp operations are reported. The releasing lane
 * snapshots the published slots, which stay valid until the next release
 * (which needs every lane of the warp again). */
static void sync_warp(fiber *f, int kind, const char *what, unsigned int mask)
{
    if (mask != 0xffffffffu)
        kernel_fail("%s with mask %#x: only the full mask (all 32 lanes) is in the emulated subset", what, mask);
    int w = f->warp;
    if (g_blk.warp_size[w] != 32)
        kernel_fail("%s in a partial warp (%d threads per block is not a multiple of 32): lanes %d..31 do not "
                    "exist",
                    what, g_blk.nthreads, g_blk.warp_size[w]);
    if (g_blk.warp_arrived[w] == 0) g_blk.warp_kind[w] = kind;
    else if (g_blk.warp_kind[w] != kind)
        kernel_fail("lane %d of warp %d reached %s while other lanes of its warp wait at a different warp "
                    "operation",
                    f->lane, w, what);
    if (++g_blk.warp_arrived[w] == 32) {
        g_blk.warp_arrived[w] = 0;
        memcpy(&g_blk.warp_result[(size_t)w * 32], &g_blk.warp_slots[(size_t)w * 32], 32 * sizeof(uint64_t));
        if (kind == KIND_MMA) wmma_compute(w);
        for (int l = 0; l < 32; l++) {
            fiber *o = g_fibers[(size_t)w * 32 + l];
            if (o->state == F_WAIT_WARP) o->state = F_RUNNABLE;
        }
        return;
    }
    f->state = F_WAIT_WARP;
    park(f);
}

void __syncwarp(unsigned int mask)
{
    fiber *f = g_cur;
    if (f) sync_warp(f, 0, "__syncwarp", mask);
}

uint64_t at_emu_warp_exchange(unsigned int mask, uint64_t bits, int mode, int arg, int width)
{
    fiber *f = g_cur;
    if (!f) return bits;
    static const char *NAMES[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                  "__ballot_sync"};
    if (width <= 0 || width > 32 || (width & (width - 1)))
        kernel_fail("%s with width %d: width must be a power of two up to 32", NAMES[mode], width);
    int w = f->warp, lane = f->lane;
    g_blk.warp_slots[(size_t)w * 32 + lane] = bits;
    sync_warp(f, 1 + mode, NAMES[mode], mask);
    const uint64_t *r = &g_blk.warp_result[(size_t)w * 32];
    if (mode == 4) {
        uint64_t ballot = 0;
        for (int l = 0; l < 32; l++)
            if (r[l]) ballot |= 1ull << l;
        return ballot;
    }
    int base = lane & ~(width - 1), src = lane;
    if (mode == 0) src = base + (arg & (width - 1));
    else if (mode == 1) src = lane - arg >= base ? lane - arg : lane;
    else if (mode == 2) src = lane + arg < base + width ? lane + arg : lane;
    else {
        src = lane ^ (arg & 31);
        if (src >= base + width) src = lane; /* a later group: own value */
    }
    return r[src];
}

int nvcuda::wmma::at_emu_wmma_collective(int op, const void *p, unsigned ldm, int col_major, size_t esize)
{
    fiber *f = g_cur;
    if (!f) return 0;
    static const char *NAMES[] = {"wmma::load_matrix_sync", "wmma::store_matrix_sync"};
    if ((uintptr_t)p % 32)
        kernel_fail("%s at %p: the pointer must be 256-bit (32-byte) aligned", NAMES[op], p);
    if (ldm == 0 || ((size_t)ldm * esize) % 16)
        kernel_fail("%s with ldm %u: ldm must be a multiple of %zu elements (16 bytes)", NAMES[op], ldm, 16 / esize);
    int w = f->warp, lane = f->lane;
    uint64_t key = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull ^ ((uint64_t)ldm << 1 | (uint64_t)col_major);
    g_blk.warp_slots[(size_t)w * 32 + lane] = key;
    sync_warp(f, KIND_WMMA_LOAD + op, NAMES[op], 0xffffffffu);
    const uint64_t *r = &g_blk.warp_result[(size_t)w * 32];
    for (int l = 0; l < 32; l++)
        if (r[l] != key)
            kernel_fail("%s: lanes %d and %d of warp %d passed different pointers, ldm or layouts (%p, ldm %u); "
                        "every lane must pass the same",
                        NAMES[op], lane, l, w, p, ldm);
    return lane;
}

void nvcuda::wmma::at_emu_wmma_mma(float *d, const float *a, const float *b, const float *c)
{
    fiber *f = g_cur;
    if (!f) {
        for (int e = 0; e < 8; e++) d[e] = NAN;
        return;
    }
    int w = f->warp, lane = f->lane;
    float *in = &g_blk.wmma_in[(size_t)w * 768];
    for (int e = 0; e < 8; e++) {
        in[at_emu_wmma_index(0, lane, e)] = a[e];
        in[256 + at_emu_wmma_index(1, lane, e)] = b[e];
        in[512 + at_emu_wmma_index(2, lane, e)] = c[e];
    }
    sync_warp(f, KIND_MMA, "wmma::mma_sync", 0xffffffffu);
    /* d stays until the next mma_sync of this warp is released, which needs this lane again */
    const float *out = &g_blk.wmma_out[(size_t)w * 256];
    for (int e = 0; e < 8; e++) d[e] = out[at_emu_wmma_index(2, lane, e)];
}

void *at_emu_dynamic_shared() { return g_dyn_shared; }

/* "cu_add" from the type name of the launching lambda ("cu_add(at_tensor*, ...)::{lambda()#1}"). */
static std::string launcher_name(const char *mangled)
{
    int st = 0;
    char *d = abi::__cxa_demangle(mangled, NULL, NULL, &st);
    std::string s = st == 0 && d ? d : mangled;
    free(d);
    size_t lam = s.find("::{lambda");
    if (lam != std::string::npos) s.resize(lam);
    size_t paren = s.find('(');
    if (paren != std::string::npos) s.resize(paren);
    size_t sp = s.rfind(' ');
    if (sp != std::string::npos) s = s.substr(sp + 1);
    return s;
}

/* A description of a deadlocked block: where each unfinished fiber waits. */
static std::string describe_deadlock(void)
{
    int at_block = 0, done = 0;
    std::string warps;
    for (int i = 0; i < g_blk.nthreads; i++) {
        fiber *f = g_fibers[i];
        if (f->state == F_WAIT_BLOCK) at_block++;
        else if (f->state == F_DONE) done++;
    }
    int nwarps = (g_blk.nthreads + 31) / 32, listed = 0;
    for (int w = 0; w < nwarps; w++) {
        if (!g_blk.warp_arrived[w]) continue;
        if (listed++ == 4) {
            warps += "; ...";
            break;
        }
        char buf[200];
        int at_sync = 0, fin = 0;
        for (int l = 0; l < g_blk.warp_size[w]; l++) {
            int st = g_fibers[(size_t)w * 32 + l]->state;
            at_sync += st == F_WAIT_BLOCK;
            fin += st == F_DONE;
        }
        snprintf(buf, sizeof buf, "; warp %d: %d lanes wait at a warp operation, %d lanes at __syncthreads, %d exited",
                 w, g_blk.warp_arrived[w], at_sync, fin);
        warps += buf;
    }
    char head[200];
    snprintf(head, sizeof head, "deadlock: %d of %d threads wait at __syncthreads, %d exited", at_block,
             g_blk.nthreads, done);
    return head + warps;
}

void at_emu_launch_raw(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void (*body)(void *),
                       void *arg, const char *name)
{
    std::lock_guard<std::recursive_mutex> lk(at_emu_lock);
    std::string who = launcher_name(name);
    if (g_cur) {
        at_emu_fail(cudaErrorLaunchFailure, "kernel launched by %s: launched from inside a kernel (not emulated)",
             who.c_str());
        return;
    }
    uint64_t nthreads = (uint64_t)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 ||
        block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        nthreads > 1024) {
        at_emu_fail(cudaErrorInvalidConfiguration, "kernel launched by %s: grid (%u,%u,%u) block (%u,%u,%u) is not a valid "
             "configuration (grid dims >= 1, x < 2^31, y, z <= 65535; block dims >= 1, at most 1024 threads, z <= 64)",
             who.c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return;
    }
    if (shared_bytes > AT_EMU_SHARED_OPTIN || shared_bytes > at_emu_shared_optin) {
        at_emu_fail(cudaErrorInvalidValue,
             "kernel launched by %s: %zu bytes of dynamic shared memory (over 48 KiB needs cudaFuncSetAttribute("
             "cudaFuncAttributeMaxDynamicSharedMemorySize) first; at most %zu)",
             who.c_str(), shared_bytes, AT_EMU_SHARED_OPTIN);
        return;
    }
    if (const char *why = at_emu_stream_problem(stream)) {
        at_emu_fail(cudaErrorInvalidResourceHandle, "kernel launched by %s: stream %p %s", who.c_str(), (void *)stream,
                    why);
        return;
    }
    if (!grow_fibers(nthreads)) {
        at_emu_fail(cudaErrorLaunchOutOfResources, "kernel launched by %s: cannot map fiber stacks (%s)", who.c_str(),
             strerror(errno));
        return;
    }
    int n = (int)nthreads, nwarps = (n + 31) / 32;
    g_kernel_name = who;
    g_body = body;
    g_arg = arg;
    std::vector<unsigned char> dyn(shared_bytes + 256);
    g_dyn_shared = (unsigned char *)(((uintptr_t)dyn.data() + 255) & ~(uintptr_t)255);
    at_emu_launch_coords.grid_dim = grid;
    at_emu_launch_coords.block_dim = block;
    g_blk.nthreads = n;
    g_blk.warp_arrived.assign(nwarps, 0);
    g_blk.warp_kind.assign(nwarps, 0);
    g_blk.warp_size.resize(nwarps);
    for (int w = 0; w < nwarps; w++) g_blk.warp_size[w] = n - 32 * w < 32 ? n - 32 * w : 32;
    g_blk.warp_slots.assign((size_t)nwarps * 32, 0);
    g_blk.warp_result.assign((size_t)nwarps * 32, 0);
    g_blk.wmma_in.assign((size_t)nwarps * 768, 0.0f);
    g_blk.wmma_out.assign((size_t)nwarps * 256, 0.0f);
    for (int i = 0; i < n; i++) {
        fiber *f = g_fibers[i];
        f->warp = i / 32;
        f->lane = i % 32;
        f->tid = uint3{(unsigned)i % block.x, (unsigned)(i / block.x) % block.y, (unsigned)(i / (block.x * block.y))};
    }
    bool failed = false;
    /* Blocks, and the threads of a block between barriers, run last first: a
     * kernel that reads what a lower thread or block wrote without a barrier
     * in between (thread 0 fills a shared value, the others use it) reads
     * stale data here instead of passing by luck of the order. */
    for (unsigned bz = grid.z; bz-- > 0 && !failed;)
        for (unsigned by = grid.y; by-- > 0 && !failed;)
            for (unsigned bx = grid.x; bx-- > 0 && !failed;) {
                at_emu_launch_coords.block_idx = uint3{bx, by, bz};
                if (shared_bytes) memset(g_dyn_shared, 0xff, shared_bytes); /* unwritten shared memory is NaN */
                g_blk.live = n;
                g_blk.block_arrived = g_blk.sync_acc = 0;
                g_blk.failed = false;
                for (int i = 0; i < n; i++) g_fibers[i]->state = F_RUNNABLE;
                for (;;) {
                    bool ran = false;
                    for (int i = n - 1; i >= 0 && !g_blk.failed; i--)
                        if (g_fibers[i]->state == F_RUNNABLE) {
                            resume(g_fibers[i]);
                            ran = true;
                        }
                    if (g_blk.failed || g_blk.live == 0) break;
                    if (!ran) {
                        std::string d = describe_deadlock();
                        at_emu_fail(cudaErrorLaunchFailure, "kernel launched by %s, block (%u,%u,%u) of grid (%u,%u,%u), "
                             "block (%u,%u,%u): %s", who.c_str(), bx, by, bz, grid.x, grid.y, grid.z, block.x,
                             block.y, block.z, d.c_str());
                        g_blk.failed = true;
                        break;
                    }
                }
                if (g_blk.failed) {
                    failed = true;
                    /* the unfinished fibers are abandoned mid-kernel: fresh frames for the next launch */
                    for (int i = 0; i < n; i++)
                        if (g_fibers[i]->state != F_DONE) new_frame(g_fibers[i]);
                }
            }
    g_dyn_shared = NULL;
    at_emu_thread_idx = NULL;
    if (!failed) {
        std::string w = "kernel launched by " + who;
        at_emu_check_guards(w.c_str());
    }
}
