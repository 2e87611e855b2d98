// SPDX-License-Identifier: GPL-2.0
/*
 * nvprobe  Per-cgroup NVIDIA driver traffic: opens, ioctls, mmaps and closes of the NVIDIA
 *          device files, the outcomes of the RM calls that create, free and schedule GPU
 *          objects, and libcuda kernel launches.
 *
 * USAGE: loaded by qpolicy/telemetry/probe.py (qpolicy trace, the daemon); not a standalone tool.
 *
 * Attaches: syscalls:sys_{enter,exit}_openat (+ openat2 and open where the kernel has them),
 * syscalls:sys_{enter,exit}_ioctl, syscalls:sys_enter_mmap, syscalls:sys_enter_close,
 * sched:sched_process_exit, uprobes on libcuda's launch entry points (on_launch), uprobes
 * and uretprobes on its synchronize calls and synchronous copies (on_sync, on_synced), and
 * uretprobes on its query calls (on_queried).
 *
 * Everything is filtered in the kernel to fds whose inode is a character device listed in the
 * devs/majors maps (filled from userspace) and keyed by the cgroup v2 id. bcc compiles this
 * against whatever headers are installed, which may be older than the running kernel, so kernel
 * structs are never dereferenced through them: the QP_OFF_* member offsets are substituted at
 * load time from the running kernel's BTF (qpolicy/telemetry/btf.py) and the walk
 * task->files->fdt->fd[fd]->f_inode->i_rdev is done with one bpf_probe_read_kernel per hop.
 *
 * probe.py substitutes the QP_ placeholders: member offsets, whether the openat2 and open
 * tracepoints exist, how a whole-process exit is recognised (the tracepoint's group_dead field,
 * or task->signal->live on kernels without it) and the output buffer (BPF ring buffer, or perf
 * buffer on kernels without one). `qpolicy trace --ebpf` prints the result.
 *
 * OVERHEAD (make bench, "probe"; CI VM, 2 vCPU AMD EPYC, kernel 6.18, 21-Nov-2026): a watched
 * ioctl whose RM_ALLOC outcome is streamed costs 1.2-1.8 us more; an ioctl on any other file
 * 0.3-0.6 us more (the fd walk and a filter miss); any other syscall about 60 ns more, since
 * syscall tracepoints put every syscall through the tracing path. A launch uprobe costs 0.8 us
 * per call where the probed instruction is emulated (push, after endbr64; libcuda 580.159.04
 * starts every launch function with push %rbp) and 9 us where it is single-stepped; a
 * synchronize call, with its uprobe and uretprobe, 2.7 us (27-Nov-2026), against a wait for
 * the GPU of microseconds to seconds; a query call, with its uretprobe, 1.6 us (28-Nov-2026: a
 * loop polling every 0.5 ms pays 0.3 % of a core). The shipped H200 PyTorch trace (1864 ioctls, 202 launches, 3.7 s) would pay
 * about 0.13 %. Hooking the NVIDIA module's ioctl handlers instead of the syscall would take the
 * cost off every other process; that needs the module's symbols (not testable without it).
 *
 * 21-Nov-2026  qpolicy  Created this.
 */
#include <uapi/linux/ptrace.h>
#include "nvprobe.h"

#define S_IFMT_ 00170000
#define S_IFCHR_ 0020000
#define MINOR_BITS 20
#define PAGE_BYTES 4096

#define NV_IOCTL_MAGIC 'F'
#define ESC_RM_ALLOC_MEMORY 0x27
#define ESC_RM_FREE 0x29
#define ESC_RM_CONTROL 0x2a
#define ESC_RM_ALLOC 0x2b
#define ESC_RM_DUP_OBJECT 0x34
#define NVOS21_BYTES 32
#define NVOS64_BYTES 48
#define CUDA_ERROR_NOT_READY 600	/* cuda.h, CUresult */

BPF_HASH(devs, u32, u8, 1024);          /* kernel dev_t -> NODE_* */
BPF_HASH(majors, u32, u8, 64);          /* major, any minor -> NODE_* */
BPF_HASH(stream_controls, u32, u8, 64); /* RM_CONTROL commands whose outcome is streamed */
/* Processes whose ioctls are counted, not streamed: the daemon's own (its searches make and free
 * a client for each client handle they check; nothing it sends is a tenant's). */
BPF_HASH(muted, u32, u8, 16);

/*
 * Counters, sized for about a thousand GPU cgroups at the H200 trace's variety per process (26
 * escapes, 76 controls, 23 classes, ~20 latency slots), allocated as used rather than up
 * front. Userspace removes the keys of cgroups that are gone (NvProbe.forget).
 */
BPF_F_TABLE("hash", struct ioctl_key, u64, ioctls, 65536, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct cg_key, u64, controls, 131072, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct cg_key, u64, allocs, 65536, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct cg_key, u64, latency, 65536, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u64, struct cg_stats, stats, 16384, BPF_F_NO_PREALLOC);
/* Threads inside a libcuda synchronize call -> the cgroup it was entered from, and how deep. */
struct sync_entry {
	u64 cgroup;
	u32 depth;
	u32 pad;
};
BPF_HASH(syncing, u32, struct sync_entry, 16384);
BPF_ARRAY(meta, u64, META_SLOTS);

struct inflight {
	u64 ts;
	u64 arg;
	u32 cmd;
	s32 fd;
	u32 dev;
	u8 node;
	u8 pad[3];
};

struct opening {
	u64 ts;
	u64 filename;
	u64 flags;
};

/* Per thread, between a syscall's entry and its exit; LRU so a lost exit cannot fill them. */
BPF_TABLE("lru_hash", u32, struct inflight, inflight, 16384);
BPF_TABLE("lru_hash", u32, struct opening, opening, 16384);
/* Processes that touched a watched device: only their exits are streamed. */
BPF_TABLE("lru_hash", u32, u8, tracked, 65536);

/* struct nv_event is too large for the BPF stack. */
BPF_PERCPU_ARRAY(scratch, struct nv_event, 1);

QP_OUTPUT_DECL

static __always_inline void meta_add(u32 slot)
{
	u64 *v = meta.lookup(&slot);
	if (v)
		lock_xadd(v, 1);
}

static __always_inline int submit(void *ctx, struct nv_event *ev, u32 size)
{
	QP_SUBMIT_BODY
}

static __always_inline void emit(void *ctx, struct nv_event *ev, u32 size)
{
	if (submit(ctx, ev, size) < 0)
		meta_add(META_LOST);
}

/* The node an fd refers to (NODE_NONE if not watched) and its device number. */
static __always_inline u8 match_fd(u64 fd, u32 *devp)
{
	void *task = (void *)bpf_get_current_task();
	void *files = NULL, *fdt = NULL, *fda = NULL, *file = NULL, *inode = NULL;
	u32 max_fds = 0, rdev = 0, major;
	u16 mode = 0;
	u8 *node;

	if ((s64)fd < 0)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&files, sizeof(files), task + QP_OFF_TASK_FILES) || !files)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&fdt, sizeof(fdt), files + QP_OFF_FILES_FDT) || !fdt)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&max_fds, sizeof(max_fds), fdt + QP_OFF_FDT_MAX_FDS))
		return NODE_NONE;
	if (fd >= max_fds)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&fda, sizeof(fda), fdt + QP_OFF_FDT_FD) || !fda)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&file, sizeof(file), fda + fd * sizeof(void *)) || !file)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&inode, sizeof(inode), file + QP_OFF_FILE_INODE) || !inode)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&mode, sizeof(mode), inode + QP_OFF_INODE_MODE))
		return NODE_NONE;
	/* Block devices have an i_rdev too; only character devices are driver nodes. */
	if ((mode & S_IFMT_) != S_IFCHR_)
		return NODE_NONE;
	if (bpf_probe_read_kernel(&rdev, sizeof(rdev), inode + QP_OFF_INODE_RDEV))
		return NODE_NONE;
	node = devs.lookup(&rdev);
	if (!node) {
		major = rdev >> MINOR_BITS;
		node = majors.lookup(&major);
	}
	if (!node)
		return NODE_NONE;
	*devp = rdev;
	return *node;
}

static __always_inline struct cg_stats *stats_of(u64 cgroup)
{
	struct cg_stats zero = {};
	struct cg_stats *st = stats.lookup_or_try_init(&cgroup, &zero);

	if (!st)
		meta_add(META_MAP_FULL);
	return st;
}

static __always_inline void track(u32 pid)
{
	u8 one = 1;

	tracked.update(&pid, &one);
}

static __always_inline void fill_header(struct nv_event *ev, u32 type, u64 id, u64 cgroup)
{
	ev->type = type;
	ev->pid = id >> 32;
	ev->tid = (u32)id;
	ev->cgroup = cgroup;
	ev->dev = 0;
	ev->ts = bpf_ktime_get_ns();
	ev->ret = 0;
	ev->dur_ns = 0;
	ev->cmd = 0;
	ev->fd = -1;
	ev->arg = 0;
	ev->inner = 0;
	ev->plen = 0;
	ev->qlen = 0;
	ev->slen = 0;
	ev->pad = 0;
}

/* -- open ---------------------------------------------------------------------------------- */

static __always_inline int open_enter(const char *filename, u64 flags)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct opening o = {.ts = bpf_ktime_get_ns(), .filename = (u64)filename, .flags = flags};

	opening.update(&tid, &o);
	return 0;
}

static __always_inline int open_exit(void *ctx, long ret)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, dev = 0, zero = 0;
	struct opening *o = opening.lookup(&tid);
	struct opening saved;
	struct nv_event *ev;
	struct cg_stats *st;
	u64 cgroup;
	u8 node;
	long n;

	if (!o)
		return 0;
	saved = *o;
	opening.delete(&tid);
	if (ret < 0)
		return 0;
	node = match_fd(ret, &dev);
	if (node == NODE_NONE)
		return 0;
	cgroup = bpf_get_current_cgroup_id();
	st = stats_of(cgroup);
	if (st)
		lock_xadd(&st->opens, 1);
	track(id >> 32);
	ev = scratch.lookup(&zero);
	if (!ev)
		return 0;
	fill_header(ev, EV_OPEN, id, cgroup);
	ev->ts = saved.ts;
	ev->dur_ns = bpf_ktime_get_ns() - saved.ts;
	ev->dev = dev;
	ev->ret = ret;
	ev->fd = ret;
	ev->arg = saved.flags;
	n = bpf_probe_read_user_str(ev->s, sizeof(ev->s), (void *)saved.filename);
	ev->slen = n > 0 ? n - 1 : 0;
	emit(ctx, ev, EV_OPEN_BYTES);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat)
{
	return open_enter(args->filename, args->flags);
}

TRACEPOINT_PROBE(syscalls, sys_exit_openat)
{
	return open_exit(args, args->ret);
}

#if QP_HAVE_OPENAT2
TRACEPOINT_PROBE(syscalls, sys_enter_openat2)
{
	u64 flags = 0;

	/* struct open_how starts with the u64 flags. */
	bpf_probe_read_user(&flags, sizeof(flags), (void *)args->how);
	return open_enter(args->filename, flags);
}

TRACEPOINT_PROBE(syscalls, sys_exit_openat2)
{
	return open_exit(args, args->ret);
}
#endif

#if QP_HAVE_OPEN
TRACEPOINT_PROBE(syscalls, sys_enter_open)
{
	return open_enter(args->filename, args->flags);
}

TRACEPOINT_PROBE(syscalls, sys_exit_open)
{
	return open_exit(args, args->ret);
}
#endif

/* -- ioctl --------------------------------------------------------------------------------- */

TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
	u32 tid = (u32)bpf_get_current_pid_tgid(), dev = 0;
	struct inflight f = {};
	u8 node = match_fd(args->fd, &dev);

	if (node == NODE_NONE)
		return 0;
	f.ts = bpf_ktime_get_ns();
	f.arg = args->arg;
	f.cmd = args->cmd;
	f.fd = args->fd;
	f.dev = dev;
	f.node = node;
	inflight.update(&tid, &f);
	return 0;
}

static __always_inline void count(u64 cgroup, u32 value, int which)
{
	struct cg_key key = {.cgroup = cgroup, .value = value};
	u64 zero = 0, *v;

	/* One table per call site: bcc resolves a map's methods at compile time. */
	if (which == 0)
		v = controls.lookup_or_try_init(&key, &zero);
	else if (which == 1)
		v = allocs.lookup_or_try_init(&key, &zero);
	else
		v = latency.lookup_or_try_init(&key, &zero);
	if (v)
		lock_xadd(v, 1);
	else
		meta_add(META_MAP_FULL);
}

/* The first bytes of a user buffer of unknown size: all of them, or what its page holds. */
static __always_inline u16 read_inner(u8 *dst, u64 src)
{
	u64 room;

	if (!bpf_probe_read_user(dst, Q_BYTES, (void *)src))
		return Q_BYTES;
	room = PAGE_BYTES - (src & (PAGE_BYTES - 1));
	if (room > Q_BYTES)
		room = Q_BYTES;
	if (room == 0 || bpf_probe_read_user(dst, room, (void *)src))
		return 0;
	return room;
}

TRACEPOINT_PROBE(syscalls, sys_exit_ioctl)
{
	u64 id = bpf_get_current_pid_tgid(), cgroup, dur, inner = 0;
	u32 tid = (u32)id, tgid = id >> 32, zero = 0, nr, size, control = 0, cls = 0;
	struct inflight *found = inflight.lookup(&tid);
	struct inflight f;
	struct ioctl_key key = {};
	struct nv_event *ev;
	struct cg_stats *st;
	u64 zero64 = 0, *v;
	int by_nr, stream = 0;

	if (!found)
		return 0;
	f = *found;
	inflight.delete(&tid);
	dur = bpf_ktime_get_ns() - f.ts;
	cgroup = bpf_get_current_cgroup_id();
	track(id >> 32);

	st = stats_of(cgroup);
	if (st) {
		lock_xadd(&st->ioctls, 1);
		lock_xadd(&st->latency_ns, dur);
	}
	count(cgroup, bpf_log2l(dur / 1000), 2);

	nr = f.cmd & 0xff;
	size = (f.cmd >> 16) & 0x3fff;
	by_nr = (f.node == NODE_CTL || f.node == NODE_GPU) && ((f.cmd >> 8) & 0xff) == NV_IOCTL_MAGIC;
	key.cgroup = cgroup;
	key.code = by_nr ? nr : f.cmd;
	key.node = f.node;
	key.by_nr = by_nr;
	v = ioctls.lookup_or_try_init(&key, &zero64);
	if (v)
		lock_xadd(v, 1);
	else
		meta_add(META_MAP_FULL);
	if (!by_nr)
		return 0;

	/* What the counters need is read from the argument after the call; the rest only when the
	 * outcome is streamed. NVOS54.cmd is at 8, hClass at 12 in NVOS21/NVOS64/NVOS02. */
	if (nr == ESC_RM_CONTROL && size >= 12) {
		if (bpf_probe_read_user(&control, sizeof(control), (void *)(f.arg + 8)) == 0) {
			count(cgroup, control, 0);
			stream = stream_controls.lookup(&control) != NULL;
		}
	} else if ((nr == ESC_RM_ALLOC && (size == NVOS21_BYTES || size == NVOS64_BYTES)) ||
		   (nr == ESC_RM_ALLOC_MEMORY && size >= 16)) {
		if (bpf_probe_read_user(&cls, sizeof(cls), (void *)(f.arg + 12)) == 0)
			count(cgroup, cls, 1);
		stream = 1;
	} else if (nr == ESC_RM_FREE || nr == ESC_RM_DUP_OBJECT) {
		stream = 1;
	}
	if (!stream || muted.lookup(&tgid))
		return 0;

	ev = scratch.lookup(&zero);
	if (!ev)
		return 0;
	fill_header(ev, EV_IOCTL, id, cgroup);
	ev->ts = f.ts;
	ev->dur_ns = dur;
	ev->dev = f.dev;
	ev->ret = args->ret;
	ev->cmd = f.cmd;
	ev->fd = f.fd;
	ev->arg = f.arg;
	/* The driver accepts exactly `size` bytes, so all of them are mapped. */
	if (size > P_BYTES)
		size = P_BYTES;
	if (size && bpf_probe_read_user(ev->p, size, (void *)f.arg) == 0)
		ev->plen = size;
	if ((nr == ESC_RM_ALLOC || nr == ESC_RM_CONTROL) && ev->plen >= 24) {
		inner = *(u64 *)&ev->p[16];
		ev->inner = inner;
		if (inner)
			ev->qlen = read_inner(ev->q, inner);
	}
	emit(args, ev, EV_IOCTL_BYTES);
	return 0;
}

/* -- mmap, close, exit --------------------------------------------------------------------- */

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
	u32 dev = 0;
	struct cg_stats *st;

	if (match_fd(args->fd, &dev) == NODE_NONE)
		return 0;
	track(bpf_get_current_pid_tgid() >> 32);
	st = stats_of(bpf_get_current_cgroup_id());
	if (st)
		lock_xadd(&st->mmaps, 1);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 dev = 0, zero = 0;
	struct nv_event *ev;

	/* At entry the fd still names its file. */
	if (match_fd(args->fd, &dev) == NODE_NONE)
		return 0;
	ev = scratch.lookup(&zero);
	if (!ev)
		return 0;
	fill_header(ev, EV_CLOSE, id, bpf_get_current_cgroup_id());
	ev->dev = dev;
	ev->fd = args->fd;
	emit(args, ev, EV_HEADER_BYTES);
	return 0;
}

/*
 * A thread returned from a synchronize call (@exited: it exits, inside one or not). The wait is
 * over when its outermost call returns.
 */
static __always_inline void end_sync(u32 tid, bool exited)
{
	struct sync_entry *entry = syncing.lookup(&tid);
	struct cg_stats *st;

	if (!entry)
		return;
	if (!exited && entry->depth > 1) {
		entry->depth--;
		return;
	}
	st = stats.lookup(&entry->cgroup);
	if (st)
		lock_xadd(&st->waiting, -1);
	syncing.delete(&tid);
}

static __always_inline int signal_group_dead(void)
{
	void *task = (void *)bpf_get_current_task();
	void *signal = NULL;
	int live = 1;

	/* do_exit() has already decremented signal->live when this tracepoint fires. */
	if (bpf_probe_read_kernel(&signal, sizeof(signal), task + QP_OFF_TASK_SIGNAL) || !signal)
		return 0;
	if (bpf_probe_read_kernel(&live, sizeof(live), signal + QP_OFF_SIGNAL_LIVE))
		return 0;
	return live == 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, pid = id >> 32, zero = 0;
	struct nv_event *ev;

	inflight.delete(&tid);
	opening.delete(&tid);
	end_sync(tid, true);
	if (!(QP_GROUP_DEAD))
		return 0;
	if (!tracked.lookup(&pid))
		return 0;
	tracked.delete(&pid);
	ev = scratch.lookup(&zero);
	if (!ev)
		return 0;
	fill_header(ev, EV_EXIT, id, bpf_get_current_cgroup_id());
	emit(args, ev, EV_HEADER_BYTES);
	return 0;
}

/* -- libcuda ------------------------------------------------------------------------------- */

int on_launch(struct pt_regs *ctx)
{
	struct cg_stats *st = stats_of(bpf_get_current_cgroup_id());

	if (st)
		lock_xadd(&st->launches, 1);
	return 0;
}

/*
 * A thread waiting in cuCtxSynchronize, cuStreamSynchronize or cuEventSynchronize, or in a
 * synchronous copy (cuMemcpy, cuMemcpyDtoH_v2, ...: it waits for the work before it), has work
 * on the GPU that it waits for, whether or not it launches anything meanwhile: a loop of long
 * kernels waited for one by one launches nothing while each runs. Counted from the cgroup the
 * call was entered from, and taken back from that one (a thread moved meanwhile, or one that
 * exits inside the call, does not leave a count behind).
 */
int on_sync(struct pt_regs *ctx)
{
	struct sync_entry entry = { .cgroup = bpf_get_current_cgroup_id(), .depth = 1 };
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct sync_entry *inside = syncing.lookup(&tid);
	struct cg_stats *st;

	if (inside) {
		inside->depth++;	/* one called from another: one wait */
		return 0;
	}
	st = stats_of(entry.cgroup);
	if (!st || syncing.update(&tid, &entry))
		return 0;
	lock_xadd(&st->syncs, 1);
	lock_xadd(&st->waiting, 1);
	return 0;
}

int on_synced(struct pt_regs *ctx)
{
	end_sync((u32)bpf_get_current_pid_tgid(), false);
	return 0;
}

/*
 * A thread that polls cuStreamQuery or cuEventQuery instead of waiting in a synchronize call
 * (PyTorch's Stream.query(), an event poll thread) launches nothing while its kernel runs
 * either. Each answer "not ready" is work of the cgroup still on the GPU; "done" says nothing.
 */
int on_queried(struct pt_regs *ctx)
{
	struct cg_stats *st;

	if ((u32)PT_REGS_RC(ctx) != CUDA_ERROR_NOT_READY)
		return 0;
	st = stats_of(bpf_get_current_cgroup_id());
	if (st)
		lock_xadd(&st->polls, 1);
	return 0;
}
