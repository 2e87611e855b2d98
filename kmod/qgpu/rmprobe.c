// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: what RM carries out is what qgpu decided on.
 *
 * nvidia_ioctl (kernel-open/nvidia/nv.c) copies a request's argument into the kernel once and
 * hands that copy to rm_ioctl (src/nvidia/arch/nvalloc/unix/src/osapi.c) for every escape it
 * does not answer itself. qgpu's hook on the ioctl handler runs before that copy is taken and
 * decides on a copy of its own: a tenant thread that rewrites its buffer in between would have
 * RM carry out a request qgpu never looked at (an export past a memory limit, a scheduling
 * control past the tenant guard). The hook leaves the part of the argument it decided on here,
 * per task, for the length of the driver's call; a kprobe on rm_ioctl compares it with the
 * driver's copy and, where they differ, answers the request NV_ERR_INSUFFICIENT_PERMISSIONS in
 * that copy (nvidia_ioctl copies it back out) without calling RM.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/kprobes.h>
#include <linux/linkage.h>
#include <linux/objtool.h>
#include <linux/sched.h>
#include <linux/spinlock.h>
#include <linux/string.h>

#include "qgpu.h"

/* Requests of configured cgroups in the driver at once; past this they go unchecked (counted). */
#define EXPECT_SLOTS	128

struct expect {
	struct task_struct *task;
	u32 cmd;
	u32 len;
	u32 status_off;
	u8 head[QGPU_EXPECT_MAX];
};

static struct expect expects[EXPECT_SLOTS];
static DEFINE_RAW_SPINLOCK(expect_lock);
/* Slots taken: most rm_ioctl calls are of unconfigured callers, and none is then looked for. */
static atomic_t expecting = ATOMIC_INIT(0);
static atomic64_t rewritten = ATOMIC64_INIT(0);
static atomic64_t unchecked = ATOMIC64_INIT(0);
static bool probed;

/* Where a refused request resumes: the caller of rm_ioctl, with the return value in ax. */
asm(".pushsection .text\n"
	".type qgpu_rm_return, @function\n"
	"qgpu_rm_return:\n"
	ANNOTATE_NOENDBR
	ASM_RET
	".size qgpu_rm_return, .-qgpu_rm_return\n"
	".popsection\n");

/**
 * qgpu_expect() - note what the calling task's request in the driver must say
 * @cmd: its escape number
 * @arg: qgpu's copy of its argument, from the start
 * @len: how many bytes of it qgpu decided on (at most QGPU_EXPECT_MAX)
 * @status_off: where its status is, for a refusal
 *
 * Context: process context, no lock held; clear with qgpu_expect_done() after the call.
 * Return: a slot for qgpu_expect_done(), or -1 where nothing is checked (no probe, no slot).
 */
int qgpu_expect(u32 cmd, const void *arg, u32 len, u32 status_off)
{
	unsigned long flags;
	int i;

	if (!probed || len > QGPU_EXPECT_MAX)
		return -1;
	raw_spin_lock_irqsave(&expect_lock, flags);
	for (i = 0; i < EXPECT_SLOTS; i++) {
		if (!expects[i].task) {
			expects[i].task = current;
			expects[i].cmd = cmd;
			expects[i].len = len;
			expects[i].status_off = status_off;
			memcpy(expects[i].head, arg, len);
			atomic_inc(&expecting);
			break;
		}
	}
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	if (i == EXPECT_SLOTS) {
		atomic64_inc(&unchecked);
		return -1;
	}
	return i;
}

/**
 * qgpu_expect_done() - the driver's call that qgpu_expect() was for has returned
 * @slot: what qgpu_expect() returned
 */
void qgpu_expect_done(int slot)
{
	unsigned long flags;

	if (slot < 0)
		return;
	raw_spin_lock_irqsave(&expect_lock, flags);
	expects[slot].task = NULL;
	atomic_dec(&expecting);
	raw_spin_unlock_irqrestore(&expect_lock, flags);
}

/**
 * qgpu_rewrites() - requests refused because the driver's copy was not qgpu's
 * @missed: set to the requests that went unchecked (every slot taken)
 *
 * Return: the count since load.
 */
u64 qgpu_rewrites(u64 *missed)
{
	*missed = atomic64_read(&unchecked);
	return atomic64_read(&rewritten);
}

/* rm_ioctl(sp, nv, nvfp, cmd, data, size): x86-64's fourth to sixth arguments. */
static int rm_ioctl_pre(struct kprobe *kp, struct pt_regs *regs)
{
	u32 cmd = regs->cx, size = regs->r9, status_off = 0;
	void *data = (void *)regs->r8;
	bool differs = false, found = false;
	unsigned long flags;
	int i;

	/* A task's own slot is taken before its call, so it sees its own count. */
	if (!atomic_read(&expecting))
		return 0;
	raw_spin_lock_irqsave(&expect_lock, flags);
	for (i = 0; i < EXPECT_SLOTS; i++) {
		const struct expect *e = &expects[i];

		if (e->task != current)
			continue;
		found = true;
		status_off = e->status_off;
		differs = e->cmd != cmd || size < e->len || memcmp(e->head, data, e->len);
		break;
	}
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	if (!found || !differs)
		return 0;
	atomic64_inc(&rewritten);
	if (size >= status_off + sizeof(u32))
		*(u32 *)(data + status_off) = NV_ERR_INSUFFICIENT_PERMISSIONS;
	/* NV_OK from rm_ioctl: nvidia_ioctl copies the refusal out as an answer. */
	regs->ax = 0;
	instruction_pointer_set(regs, (unsigned long)qgpu_rm_return);
	return 1;
}

static struct kprobe rm_ioctl_probe = {
	.pre_handler = rm_ioctl_pre,
};

static char probe_symbol[MODULE_NAME_LEN + 16];

/**
 * qgpu_rmprobe_init() - probe the target driver's rm_ioctl
 *
 * Without it (a driver that has no rm_ioctl, kprobes refused) qgpu works as before, on its own
 * copy alone, and says so.
 *
 * Return: 0.
 */
int qgpu_rmprobe_init(void)
{
	int err;

	snprintf(probe_symbol, sizeof(probe_symbol), "%s:rm_ioctl", qgpu_target);
	rm_ioctl_probe.symbol_name = probe_symbol;
	err = register_kprobe(&rm_ioctl_probe);
	if (err) {
		pr_warn("no probe on %s (%d): requests are checked on qgpu's copy only\n",
			probe_symbol, err);
		return 0;
	}
	probed = true;
	return 0;
}

/**
 * qgpu_rmprobe_exit() - remove the probe (after the hooks: no request is expected any more)
 */
void qgpu_rmprobe_exit(void)
{
	if (!probed)
		return;
	probed = false;
	unregister_kprobe(&rm_ioctl_probe);
}
