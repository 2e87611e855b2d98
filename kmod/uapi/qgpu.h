/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * qgpu.ko's user interface: the spec. qpolicy/enforcers/kmod/uapi.py is the Python mirror and
 * tests/unit/test_qgpu_uapi.py keeps the two in agreement.
 *
 * Control is the generic netlink family "qgpu" (every command needs CAP_NET_ADMIN in the initial
 * user namespace). Pods are cgroup v2 directories named by their cgroup id, which is the inode
 * number of the directory (stat(2) st_ino). State that is read more than written is also in
 * sysfs, one value per file:
 *
 *   /sys/kernel/qgpu/version          interface version (QGPU_GENL_VERSION)
 *   /sys/kernel/qgpu/target           the hooked driver: "nvidia" or "nvmock"
 *   /sys/kernel/qgpu/hooked           1 while the driver's ioctl and mmap entries are hooked
 *   /sys/kernel/qgpu/uvm_hooked       1 while nvidia-uvm's mmap is hooked too (managed memory
 *                                     is refused to memory-limited cgroups); 0 where it was
 *                                     not loaded when qgpu was
 *   /sys/kernel/qgpu/cgroups          number of configured cgroups
 *   /sys/kernel/qgpu/gpuN/policy      best-effort | fixed-share | burst-share (root may write)
 *   /sys/kernel/qgpu/gpuN/period_us   scheduling period (root may write)
 *   /sys/kernel/qgpu/gpuN/offline_timeslice_us, online_timeslice_us
 *                                     each class's TSG timeslice (root may write; see below)
 *   /sys/kernel/qgpu/gpuN/offline_preemption
 *                                     own | cta: offline contexts' compute preemption mode
 *                                     (root may write; see below)
 *   /sys/kernel/qgpu/gpuN/nr_periods  periods run
 *   /sys/kernel/qgpu/gpuN/passes      scheduler passes that looked at the GPU's channels
 *   /sys/kernel/qgpu/gpuN/userd_reads channels' USERD read by those passes (each a PCIe read
 *                                     on a GPU; a channel idle for a second is read only every
 *                                     cold_look_us, one fed only in its first second every
 *                                     dormant_look_us: module parameters)
 *   /sys/kernel/qgpu/gpuN/online_busy 1 while an online cgroup on the GPU has work
 *   /sys/kernel/qgpu/rm_version       the driver version whose in-kernel RM entry qgpu uses
 *                                     (empty: none, time slicing is off)
 *   /sys/kernel/qgpu/events_sent      events multicast since load
 *   /sys/kernel/qgpu/events_dropped   OOM and DENIED events dropped past the rate limit
 *
 * A configured cgroup governs every cgroup below it (the nearest configured ancestor wins):
 * its memory limit, time slices and tenant guard apply to the processes of all of them, and
 * their objects are counted in its statistics. Events are sent only while the "events" group
 * has a listener; OOM and DENIED together at most QGPU_EVENT_RATE_PER_SEC a second, each naming
 * the configured cgroup whose counter moved (not the child cgroup the process sits in).
 *
 * Every command is all or nothing: a message that fails validation changes nothing.
 *
 * TSG timeslices: while a GPU has at least one configured online cgroup, qgpu sets the timeslice
 * of every TSG (channel group) of the cgroups configured for that GPU with RM's SET_TIMESLICE,
 * offline ones to OFFLINE_TIMESLICE_US and online ones to ONLINE_TIMESLICE_US (0: the TSG keeps
 * its own). A TSG gets its own timeslice back (the one RM held before qgpu's first, or the last
 * its tenant asked for) once qgpu no longer sets one: its cgroup unconfigured or moved, the last
 * online cgroup of the GPU gone, the value set to 0, qgpu unloaded.
 *
 * Offline preemption: with OFFLINE_PREEMPTION CTA, every offline TSG given its class's timeslice
 * whose context computes also gets CTA compute preemption (GR_SET_CTXSW_PREEMPTION_MODE on its
 * compute channel), and its own mode back (read with GR_GET_CTXSW_MODES before the first set, or
 * the last its tenant set) under the same conditions as its timeslice. CTA waits for the running
 * thread blocks instead of saving them: it can only help next to short kernels.
 */
#ifndef _UAPI_QPOLICY_QGPU_H
#define _UAPI_QPOLICY_QGPU_H

#define QGPU_GENL_NAME		"qgpu"
#define QGPU_GENL_VERSION	1
#define QGPU_MCGRP_EVENTS	"events"

#define QGPU_MAX_GPUS		8
#define QGPU_MAX_CGROUPS	256
#define QGPU_PERIOD_MIN_US	1000
#define QGPU_PERIOD_MAX_US	1000000
#define QGPU_PERIOD_DEFAULT_US	50000
#define QGPU_SHARE_MAX		100
#define QGPU_TIMESLICE_MAX_US	1000000
#define QGPU_OFFLINE_TIMESLICE_DEFAULT_US	1
#define QGPU_OFFLINE_PREEMPTION_DEFAULT	QGPU_PREEMPTION_OWN
#define QGPU_ONLINE_TIMESLICE_DEFAULT_US	8192

enum qgpu_cmd {
	QGPU_CMD_UNSPEC = 0,
	QGPU_CMD_GPU_SET = 1,		/* GPU; any of POLICY .. OFFLINE_PREEMPTION */
	QGPU_CMD_GPU_GET = 2,		/* dump: one message per GPU */
	QGPU_CMD_CGROUP_SET = 3,	/* CGROUP_ID, GPU, CLASS, SHARE; MEM_LIMIT optional */
	QGPU_CMD_CGROUP_DEL = 4,	/* CGROUP_ID */
	QGPU_CMD_CGROUP_GET = 5,	/* dump: one message per configured cgroup, with stats */
	QGPU_CMD_EVENT = 6,		/* multicast on "events": EVENT, CGROUP_ID, GPU, ... */
	__QGPU_CMD_MAX,
};

#define QGPU_CMD_MAX (__QGPU_CMD_MAX - 1)

enum qgpu_attr {
	QGPU_A_UNSPEC = 0,
	QGPU_A_GPU = 1,			/* u32, < QGPU_MAX_GPUS */
	QGPU_A_POLICY = 2,		/* u8, enum qgpu_policy */
	QGPU_A_PERIOD_US = 3,		/* u32, QGPU_PERIOD_MIN_US..QGPU_PERIOD_MAX_US */
	QGPU_A_CGROUP_ID = 4,		/* u64 */
	QGPU_A_CLASS = 5,		/* u8, enum qgpu_class */
	QGPU_A_SHARE = 6,		/* u32, percent 1..100 */
	QGPU_A_MEM_LIMIT = 7,		/* u64, bytes of device memory; 0: none */
	QGPU_A_PAD = 8,
	/* read only, in GPU_GET and CGROUP_GET answers */
	QGPU_A_MEM_USED = 9,		/* u64, bytes */
	QGPU_A_NR_PERIODS = 10,		/* u64, periods the cgroup had work in */
	QGPU_A_NR_THROTTLED = 11,	/* u64, of those, periods it was closed with work left */
	QGPU_A_THROTTLED_NS = 12,	/* u64, time closed with work pending */
	QGPU_A_OPEN_NS = 13,		/* u64, time its channels were open while it had work */
	QGPU_A_CLIENTS = 14,		/* u32, live RM clients */
	QGPU_A_TSGS = 15,		/* u32 */
	QGPU_A_CHANNELS = 16,		/* u32 */
	/*
	 * OOM: refused by the memory gate: past the limit, or memory qgpu cannot charge in a
	 * limited cgroup (fabric memory, export to and import from an fd, dma-buf export, CUDA
	 * managed memory, a duplicate without the RM entry), whatever the tenant is answered
	 * (NV_ERR_NO_MEMORY, NV_ERR_INSUFFICIENT_PERMISSIONS or -EPERM). DENIED: refused by the
	 * tenant guard (a gated cgroup's own scheduling controls) or by the handle rules (an
	 * object left for RM to name, another file's client). A refusal counts in one of the two.
	 */
	QGPU_A_OOM = 17,		/* u64, refused by the memory gate */
	QGPU_A_DENIED = 18,		/* u64, refused by the tenant guard or a handle rule */
	QGPU_A_BUSY = 19,		/* u8, 1 while it has work pending */
	QGPU_A_EVENT = 20,		/* u8, enum qgpu_event */
	QGPU_A_ONLINE_BUSY = 21,	/* u8, GPU_GET: an online cgroup has work */
	QGPU_A_SWITCHES = 22,		/* u64, GPU_GET: slice changes */
	/* GPU_SET and GPU_GET */
	QGPU_A_OFFLINE_TIMESLICE_US = 23,	/* u32, us, <= QGPU_TIMESLICE_MAX_US; 0: own */
	QGPU_A_ONLINE_TIMESLICE_US = 24,	/* u32, us, <= QGPU_TIMESLICE_MAX_US; 0: own */
	QGPU_A_OWN_TIMESLICES = 25,	/* u8, CGROUP_GET: TSGs keep their own (contexts > 1) */
	/*
	 * CGROUP_GET: offline, and its TSGs hold the class's short timeslice, so the GPU itself
	 * switches to online work (qgpu's online_gate 1 leaves it open for that work)
	 */
	QGPU_A_TIMESLICE_PREEMPTED = 26,	/* u8 */
	QGPU_A_OFFLINE_PREEMPTION = 27,	/* u8, GPU_SET and GPU_GET: enum qgpu_preemption */
	__QGPU_A_MAX,
};

#define QGPU_A_MAX (__QGPU_A_MAX - 1)

enum qgpu_policy {
	QGPU_POLICY_BEST_EFFORT = 0,
	QGPU_POLICY_FIXED_SHARE = 1,
	QGPU_POLICY_BURST_SHARE = 2,
};

enum qgpu_class {
	QGPU_CLASS_OFFLINE = 0,
	QGPU_CLASS_ONLINE = 1,
};

/* The compute preemption mode qgpu gives offline contexts holding their class's timeslice. */
enum qgpu_preemption {
	QGPU_PREEMPTION_OWN = 0,	/* their own (CUDA's CILP) */
	QGPU_PREEMPTION_CTA = 1,	/* CTA: the running thread blocks end, none is saved */
};

enum qgpu_event {
	QGPU_EVENT_OOM = 1,		/* the memory gate refused: counted in QGPU_A_OOM */
	QGPU_EVENT_DENIED = 2,		/* the tenant guard or a handle rule: QGPU_A_DENIED */
	QGPU_EVENT_CGROUP_GONE = 3,	/* a configured cgroup was removed; its config is dropped */
};

/* OOM and DENIED events multicast per second at most, together; the rest are counted. */
#define QGPU_EVENT_RATE_PER_SEC	100

#endif /* _UAPI_QPOLICY_QGPU_H */
