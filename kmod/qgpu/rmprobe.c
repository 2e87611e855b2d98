// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: what RM carries out is what qgpu decided on, and what qgpu learns of it is what RM
 * answered.
 *
 * nvidia_ioctl (kernel-open/nvidia/nv.c) copies a request's argument into the kernel once and
 * hands that copy to rm_ioctl (src/nvidia/arch/nvalloc/unix/src/osapi.c) for every escape it
 * does not answer itself. qgpu's hook on the ioctl handler runs before that copy is taken and
 * decides on a copy of its own: a tenant thread that rewrites its buffer in between would have
 * RM carry out a request qgpu never looked at (an export past a memory limit, a scheduling
 * control past the tenant guard, an object at a handle qgpu never asks RM about). The hook
 * leaves the part of the argument it decided on here, per task, for the length of the driver's
 * call; a kprobe on rm_ioctl compares it with the driver's copy and, where they differ, answers
 * the request NV_ERR_INSUFFICIENT_PERMISSIONS in that copy (nvidia_ioctl copies it back out)
 * without calling RM.
 *
 * The answer comes back the same way: nvidia_ioctl copies the driver's copy out to the tenant
 * after rm_ioctl returns, where a tenant thread may rewrite it before qgpu reads it. A kretprobe
 * on the same rm_ioctl keeps the first bytes of the driver's copy as RM left them, and
 * qgpu_expect_done() hands them to the hook in place of a second fetch of tenant memory.
 *
 * RM_MAP_MEMORY names the file to map by an fd, which RM looks up in the caller's fd table once,
 * during the call (nv_get_file_private, kernel-open/nvidia/nv.c, from
 * nv_add_mapping_context_to_file); looked up again after the call the number may name another
 * file. A kretprobe on nv_get_file_private keeps the file RM found, with a reference, for the
 * task's checked RM_MAP_MEMORY (qgpu_expect_file()).
 *
 * The two probes on rm_ioctl sit on one address, so kprobes aggregates them and runs their entry
 * handlers one after the other, in an order this file does not rely on: where the refusal runs
 * first it returns past rm_ioctl and the kretprobe's entry handler never runs (no return
 * instance); where the kretprobe's runs first, the refusal's return goes through the kretprobe
 * trampoline and the return handler sees the slot marked refused and keeps nothing.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/bitmap.h>
#include <linux/file.h>
#include <linux/fs.h>
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
	bool entered;			/* rm_ioctl was called with it */
	bool refused;			/* and answered by rm_ioctl_pre(), not RM */
	bool answered;			/* answer holds the driver's copy as rm_ioctl left it */
	u32 answer_len;
	struct file *mapped;		/* RM_MAP_MEMORY: the file RM took its fd for, held */
	u8 head[QGPU_EXPECT_MAX];
	u8 answer[QGPU_ANSWER_MAX];
};

static struct expect expects[EXPECT_SLOTS];
/*
 * Which slots are taken: a lookup walks only those (one or a few), not all EXPECT_SLOTS, three
 * times per checked call and once per other call while any is in flight.
 */
static DECLARE_BITMAP(taken, EXPECT_SLOTS);
static DEFINE_RAW_SPINLOCK(expect_lock);
/* Slots taken: most rm_ioctl calls are of unconfigured callers, and none is then looked for. */
static atomic_t expecting = ATOMIC_INIT(0);
static atomic64_t rewritten = ATOMIC64_INIT(0);
static atomic64_t unchecked = ATOMIC64_INIT(0);
static bool probed;
static bool answering;		/* the kretprobe is in place */
static bool finding;		/* the kretprobe on nv_get_file_private is in place */

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
 * The calling task may hold one slot at a time, around one call into the driver.
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
	i = find_first_zero_bit(taken, EXPECT_SLOTS);
	if (i < EXPECT_SLOTS) {
		__set_bit(i, taken);
		expects[i].task = current;
		expects[i].cmd = cmd;
		expects[i].len = len;
		expects[i].status_off = status_off;
		expects[i].entered = false;
		expects[i].refused = false;
		expects[i].answered = false;
		expects[i].mapped = NULL;
		memcpy(expects[i].head, arg, len);
		atomic_inc(&expecting);
	}
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	if (i >= EXPECT_SLOTS) {
		atomic64_inc(&unchecked);
		return -1;
	}
	return i;
}

/**
 * qgpu_expect_done() - the driver's call that qgpu_expect() was for has returned
 * @slot: what qgpu_expect() returned
 * @answer: where to put the first @len bytes of the driver's copy as RM left it, or NULL
 * @len: how many (at most QGPU_ANSWER_MAX)
 *
 * Context: process context, no lock held.
 * Return: QGPU_REPLY_RM where @answer holds RM's answer; QGPU_REPLY_NONE where RM was not
 * reached (the request was refused in rm_ioctl as rewritten); QGPU_REPLY_UNKNOWN where qgpu
 * cannot tell: no slot, no kretprobe, its return instance missed (counted in qgpu_rewrites()'
 * @missed), or neither probe saw rm_ioctl called (the driver turned the request down before,
 * or a probe missed it: taken as not knowing rather than as RM doing nothing). The caller then
 * falls back to what the tenant's memory says.
 */
enum qgpu_reply qgpu_expect_done(int slot, void *answer, u32 len)
{
	enum qgpu_reply reply = QGPU_REPLY_UNKNOWN;
	struct file *mapped;
	bool missed = false;
	struct expect *e;
	unsigned long flags;

	if (slot < 0)
		return QGPU_REPLY_UNKNOWN;
	e = &expects[slot];
	raw_spin_lock_irqsave(&expect_lock, flags);
	mapped = e->mapped;
	e->mapped = NULL;
	if (e->refused) {
		reply = QGPU_REPLY_NONE;
	} else if (e->answered && answer && len <= e->answer_len) {
		memcpy(answer, e->answer, len);
		reply = QGPU_REPLY_RM;
	} else if (e->entered && answering && answer) {
		/* RM was called and its answer not kept: the tenant's memory is read instead. */
		missed = true;
	}
	e->task = NULL;
	__clear_bit(slot, taken);
	atomic_dec(&expecting);
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	if (mapped)
		fput(mapped);
	if (missed)
		atomic64_inc(&unchecked);
	return reply;
}

/**
 * qgpu_expect_file() - the file RM took an RM_MAP_MEMORY's fd for, during the call
 * @slot: what qgpu_expect() returned for the RM_MAP_MEMORY, before qgpu_expect_done()
 *
 * RM looks the answer's fd up in the caller's fd table once, during the call
 * (nv_add_mapping_context_to_file() → nv_get_file_private(), kernel-open/nvidia/nv-usermap.c
 * and nv.c), and leaves the mapping on that file. Looked up again after the call, the number
 * may name another file by then (a tenant thread's dup2() or close()).
 *
 * Context: process context, no lock held.
 * Return: that file, with a reference the caller puts; NULL where the probe did not see it
 * (no probe, no slot, RM never looked the fd up).
 */
struct file *qgpu_expect_file(int slot)
{
	struct file *mapped;
	unsigned long flags;

	if (slot < 0)
		return NULL;
	raw_spin_lock_irqsave(&expect_lock, flags);
	mapped = expects[slot].mapped;
	expects[slot].mapped = NULL;
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	return mapped;
}

/**
 * qgpu_rewrites() - requests refused because the driver's copy was not qgpu's
 * @missed: set to the requests that went unchecked (every slot taken), and those whose answer
 * was read from the tenant's memory for want of a kretprobe return instance
 *
 * Return: the count since load.
 */
u64 qgpu_rewrites(u64 *missed)
{
	*missed = atomic64_read(&unchecked);
	return atomic64_read(&rewritten);
}

/* The task's slot, where it has one; -1 otherwise. Context: expect_lock held. */
static int slot_of_current(void)
{
	int i;

	lockdep_assert_held(&expect_lock);
	for_each_set_bit(i, taken, EXPECT_SLOTS)
		if (expects[i].task == current)
			return i;
	return -1;
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
	i = slot_of_current();
	if (i >= 0) {
		struct expect *e = &expects[i];

		found = true;
		status_off = e->status_off;
		differs = e->cmd != cmd || size < e->len || memcmp(e->head, data, e->len);
		e->entered = true;
		/* Before the redirect: a return handler that runs for it keeps nothing. */
		e->refused = differs;
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

/* What a return instance carries from rm_ioctl's entry to its return. */
struct answer_ref {
	int slot;
	const void *data;
	u32 size;
};

/*
 * At a probed function's entry: the calling task's slot, -1 where it holds none (or, with @cmd
 * nonzero, one for another escape). @enter marks it as having reached rm_ioctl.
 */
static int slot_at_entry(u32 cmd, bool enter)
{
	unsigned long flags;
	int slot;

	if (!atomic_read(&expecting))
		return -1;
	raw_spin_lock_irqsave(&expect_lock, flags);
	slot = slot_of_current();
	if (slot >= 0 && cmd && expects[slot].cmd != cmd)
		slot = -1;
	if (slot >= 0 && enter)
		expects[slot].entered = true;
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	return slot;
}

/* rm_ioctl entered: a return instance only for a task that holds a slot (nonzero: none). */
static int rm_ioctl_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct answer_ref *ref = (struct answer_ref *)ri->data;

	ref->slot = slot_at_entry(0, true);
	if (ref->slot < 0)
		return 1;
	ref->data = (const void *)regs->r8;
	ref->size = regs->r9;
	return 0;
}

/*
 * rm_ioctl returned: the driver's copy is RM's answer, not yet copied out. The slot is still
 * the task's (qgpu_expect_done() runs after nvidia_ioctl returns); a request rm_ioctl_pre()
 * refused is not RM's answer and is left alone.
 */
static int rm_ioctl_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	const struct answer_ref *ref = (const struct answer_ref *)ri->data;
	struct expect *e = &expects[ref->slot];
	unsigned long flags;

	raw_spin_lock_irqsave(&expect_lock, flags);
	if (e->task == current && !e->refused) {
		e->answer_len = min_t(u32, ref->size, QGPU_ANSWER_MAX);
		memcpy(e->answer, ref->data, e->answer_len);
		e->answered = true;
	}
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	return 0;
}

static struct kretprobe rm_ioctl_ret_probe = {
	.entry_handler = rm_ioctl_entry,
	.handler = rm_ioctl_ret,
	.data_size = sizeof(struct answer_ref),
};

/* nv_get_file_private(fd, ctl, os_private): x86-64's third argument, where it leaves the file. */
static int file_lookup_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct answer_ref *ref = (struct answer_ref *)ri->data;

	ref->slot = slot_at_entry(NV_ESC_RM_MAP_MEMORY, false);
	if (ref->slot < 0)
		return 1;
	ref->data = (const void *)regs->dx;
	return 0;
}

/* A file found (a non-NULL return): the one in *os_private, kept with a reference of qgpu's. */
static int file_lookup_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	const struct answer_ref *ref = (const struct answer_ref *)ri->data;
	struct expect *e = &expects[ref->slot];
	struct file *file;
	unsigned long flags;

	if (!regs_return_value(regs))
		return 0;
	file = *(struct file * const *)ref->data;
	raw_spin_lock_irqsave(&expect_lock, flags);
	if (file && e->task == current && !e->mapped)
		e->mapped = get_file(file);
	raw_spin_unlock_irqrestore(&expect_lock, flags);
	return 0;
}

static struct kretprobe file_lookup_probe = {
	.entry_handler = file_lookup_entry,
	.handler = file_lookup_ret,
	.data_size = sizeof(struct answer_ref),
};

static char probe_symbol[MODULE_NAME_LEN + 16];
static char lookup_symbol[MODULE_NAME_LEN + 24];

/*
 * A kretprobe on the target driver's @function, @symbol (of @size) its name there. A return
 * instance is held only by a task with a slot, for the length of its call, and taken for an
 * instant by every other caller before the entry handler turns it down. Without it qgpu says so,
 * and @without what it does instead.
 */
static bool place_return_probe(struct kretprobe *rp, char *symbol, size_t size,
			       const char *function, const char *without)
{
	int err;

	snprintf(symbol, size, "%s:%s", qgpu_target, function);
	rp->kp.symbol_name = symbol;
	rp->maxactive = EXPECT_SLOTS + num_possible_cpus();
	err = register_kretprobe(rp);
	if (err)
		pr_warn("no return probe on %s (%d): %s\n", symbol, err, without);
	return !err;
}

/**
 * qgpu_rmprobe_init() - probe the target driver's rm_ioctl and nv_get_file_private
 *
 * Without the kprobe (a driver that has no rm_ioctl, kprobes refused) qgpu works as before, on
 * its own copy alone, and says so; without the kretprobe on rm_ioctl it checks requests but
 * reads what RM answered from the tenant's memory, and without the one on nv_get_file_private
 * it finds a mapping's file by its fd number after the call; it says so.
 *
 * Return: 0.
 */
int qgpu_rmprobe_init(void)
{
	int err;

	answering = place_return_probe(&rm_ioctl_ret_probe, probe_symbol, sizeof(probe_symbol),
				       "rm_ioctl", "answers are read from the caller's memory");
	finding = place_return_probe(&file_lookup_probe, lookup_symbol, sizeof(lookup_symbol),
				     "nv_get_file_private",
				     "a mapping's file is found by its fd number after the call");
	rm_ioctl_probe.symbol_name = probe_symbol;
	err = register_kprobe(&rm_ioctl_probe);
	if (err) {
		pr_warn("no probe on %s (%d): requests are checked on qgpu's copy only\n",
			probe_symbol, err);
		qgpu_rmprobe_exit();
		return 0;
	}
	probed = true;
	return 0;
}

/**
 * qgpu_rmprobe_answers_missed() - return instances the kretprobe could not take
 *
 * Return: the kretprobe's nmissed since load (0 without it). A miss of a task that holds a
 * slot is also counted in qgpu_rewrites()' @missed.
 */
u64 qgpu_rmprobe_answers_missed(void)
{
	return answering ? READ_ONCE(rm_ioctl_ret_probe.nmissed) : 0;
}

/**
 * qgpu_rmprobe_exit() - remove the probes (after the hooks: no request is expected any more)
 */
void qgpu_rmprobe_exit(void)
{
	if (probed) {
		probed = false;
		unregister_kprobe(&rm_ioctl_probe);
	}
	if (answering) {
		answering = false;
		unregister_kretprobe(&rm_ioctl_ret_probe);
	}
	if (finding) {
		finding = false;
		unregister_kretprobe(&file_lookup_probe);
	}
}
