/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nvprobe.h  What crosses between the BPF side (nvprobe.c) and userspace
 *            (qpolicy/telemetry/wire.py mirrors it; a test keeps the two in agreement).
 *
 * Fixed-width types only and explicit padding, so both sides agree on every offset.
 */
#ifndef QPOLICY_NVPROBE_H
#define QPOLICY_NVPROBE_H

/* Which device file an fd refers to; the filter maps hold these. 0 = not watched. */
#define NODE_NONE 0
#define NODE_CTL 1
#define NODE_GPU 2
#define NODE_UVM 3
#define NODE_MODESET 4
#define NODE_CAPS 5
#define NODE_OTHER 6

/* Event types streamed to userspace. */
#define EV_OPEN 1
#define EV_CLOSE 2
#define EV_EXIT 3
#define EV_IOCTL 4

#define P_BYTES 64   /* ioctl argument after the call, as the trace format's p */
#define Q_BYTES 96   /* inner params after the call, as the trace format's q */
#define PATH_BYTES 256

/* Indexes into the meta array. */
#define META_LOST 0        /* events the output buffer had no room for */
#define META_MAP_FULL 1    /* counter updates dropped because a map was full */
#define META_SLOTS 4

struct nv_event {
	__u32 type;
	__u32 pid;
	__u32 tid;
	__u32 dev;      /* kernel dev_t: major << 20 | minor */
	__u64 ts;       /* ns (bpf_ktime_get_ns) at syscall entry */
	__u64 cgroup;   /* cgroup v2 id */
	__s64 ret;
	__u64 dur_ns;
	__u32 cmd;      /* ioctl request */
	__s32 fd;
	__u64 arg;      /* ioctl argument pointer; open: flags */
	__u64 inner;    /* RM_ALLOC / RM_CONTROL inner params pointer */
	__u16 plen;
	__u16 qlen;
	__u16 slen;
	__u16 pad;
	__u8 p[P_BYTES];
	__u8 q[Q_BYTES];
	char s[PATH_BYTES];
};

/* How much of struct nv_event each type sends: the header, + p and q, + the path. */
#define EV_HEADER_BYTES 80
#define EV_IOCTL_BYTES (EV_HEADER_BYTES + P_BYTES + Q_BYTES)
#define EV_OPEN_BYTES (EV_IOCTL_BYTES + PATH_BYTES)

/* ioctl counts: code is the escape NR when by_nr, else the whole request. */
struct ioctl_key {
	__u64 cgroup;
	__u32 code;
	__u8 node;
	__u8 by_nr;
	__u16 pad;
};

/* Counts keyed by cgroup and one number: a control command, an alloc class, a log2 slot. */
struct cg_key {
	__u64 cgroup;
	__u32 value;
	__u32 pad;
};

struct cg_stats {
	__u64 ioctls;
	__u64 latency_ns;
	__u64 opens;
	__u64 mmaps;
	__u64 launches;
	__u64 syncs;	/* libcuda synchronize calls and synchronous copies entered */
	__u64 waiting;	/* threads inside one now (entered less returned) */
	__u64 polls;	/* libcuda query calls answered "not ready" */
};

#endif /* QPOLICY_NVPROBE_H */
