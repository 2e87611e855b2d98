// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the per-GPU period scheduler.
 *
 * One thread per GPU with gated cgroups wakes every poll_us on an hrtimer (a low SCHED_FIFO
 * priority keeps the tenants' CPU load from delaying it). Each pass it
 *   - reads every gated channel's USERD: GP_PUT ahead of GP_GET means work is pending;
 *   - accounts the time since the last pass the way CFS bandwidth does: open time while busy,
 *     throttled time while busy and closed, periods busy and periods throttled; an offline
 *     cgroup's slice runs down while it is open and busy, from when its work is seen on the GPU
 *     after it was opened (at most start_grace_us later; half the look's interval before it;
 *     after a turn of its own, from RM's answer to the open) until RM has closed it: the
 *     switch to it, RM's call and the GPU's context switch, is nobody's time, so a fixed cost
 *     per turn does not come off small shares more than large ones (settle());
 *   - at a period boundary refills the offline cgroups' slices from the policy
 *     (fixed-share: share x period, a cap; burst-share: the period split among the busy cgroups
 *     in proportion to their shares; best-effort: split equally); under fixed-share a busy
 *     cgroup whose turn the period's switches pushed past its end has it first, and the next
 *     period starts at the refill (slices_owed());
 *   - gives the GPU to one offline cgroup at a time (its slice runs while it has work; an idle
 *     holder passes the GPU on, and under burst-share and best-effort the period's unused time
 *     is split again among the busy ones), and to online cgroups before any offline one: while
 *     an online cgroup has work, or had within online_hold_us, the GPU switches to it at the
 *     end of the offline TSGs' short class timeslice (timeslice.c); with online_gate 1 an
 *     offline cgroup whose TSGs do not hold that timeslice is closed as well, with 2 all are;
 *   - closes and opens channels whose state differs from the plan, through the driver's
 *     in-kernel RM entry (FIFO_DISABLE_CHANNELS), outside qgpu_lock, at most MAX_CHANGES a
 *     pass (the rest at the next passes).
 * What busy means, and for a channel whose USERD qgpu cannot read: userd.c.
 *
 * A pass reads one channel of each busy cgroup and every warm channel of the idle ones; a channel
 * that has shown no work for a second is read only every cold_look_us (userd.c). passes and
 * userd_reads in sysfs count both.
 *
 * Each GPU walks only its own run queue, qgpu_gpu_channels[gpu], which the tracker keeps at
 * RM_ALLOC and RM_FREE time: the time a pass holds qgpu_lock (and so delays the hooks) grows
 * with that GPU's channels and configured cgroups, not with every object tracked.
 *
 * A channel's state (obj->enabled) is what RM last carried out: it is set once RM answered
 * NV_OK, so a failed call is planned again, after a back-off (CH_RETRY_MIN_MS doubling up to
 * CH_RETRY_MAX_MS). While its call is in flight a channel is marked in_change; if the tenant
 * frees it meanwhile the tracker leaves it to this scheduler to free.
 *
 * Unloading opens every channel qgpu closed, whatever their number, pass after pass, retrying
 * failed calls (UNLOAD_TRIES passes in a row without progress, then it gives up and says so).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/hrtimer.h>
#include <linux/jiffies.h>
#include <linux/kthread.h>
#include <linux/ktime.h>
#include <linux/lockdep.h>
#include <linux/math64.h>
#include <linux/module.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/wait.h>

#include "qgpu.h"

unsigned int qgpu_poll_us = 250;
module_param_named(poll_us, qgpu_poll_us, uint, 0444);
MODULE_PARM_DESC(poll_us, "How often a GPU's scheduler looks at its channels, us (50-5000)");

static unsigned int start_grace_us = 2000;
module_param(start_grace_us, uint, 0644);
MODULE_PARM_DESC(start_grace_us,
		 "A turn's slice runs from when its work reaches the GPU, at most this long after it began, us");

static unsigned int online_hold_us = 1000;
module_param(online_hold_us, uint, 0644);
MODULE_PARM_DESC(online_hold_us,
		 "Offline work stays closed this long after online work was last seen pending, us");

/*
 * Which offline cgroups are closed while online work runs. With the class timeslices set
 * (timeslice.c) the GPU itself switches to an online TSG at the end of the offline one's short
 * slice; closing the offline channels as well costs two RM controls per online burst (0.6-1.3
 * ms each under GSP) and keeps offline work out for the holds: in the VM with controls that
 * slow, the offline pod kept 0.76 of what online work left closed and 0.90 left open, the
 * online p99 as near solo (BENCHMARKS.md, 2026-11-27). A cgroup whose TSGs keep their own
 * timeslices (several CUDA contexts) or whose value RM has not carried out yet has only the
 * closing, and on real GPUs that does not pay as a default: the doctor's
 * disable-beside-request, a trainer at its own timeslice disabled beside each online request
 * as qgpu would close it, took the online p99 next to an 8192 trainer from 2.85 to 1.91-1.97 ms
 * (p50 1.68 to 1.59-1.64) for 6-7 % of the trainer, and next to a 2048 trainer made p50 and
 * p99 about 1.6 x native's for 17-19 % of it, on an H100 and an H200 (BENCHMARKS.md,
 * 2026-11-27, calls 14A-B). So by default qgpu closes nothing for online work, as the rm
 * enforcer does; 1 closes such cgroups (where their kernels are long). Offline cgroups take
 * turns whatever the mode.
 */
enum {
	GATE_NEVER,		/* the timeslices alone */
	GATE_UNPREEMPTED,	/* close those the GPU does not preempt (cg->ts_preempted) */
	GATE_ALWAYS,		/* close every offline cgroup (the only way before 2026-11-27) */
};

static unsigned int online_gate = GATE_NEVER;

/* A bad value, out of range or not a number at all, is -EINVAL (kstrtouint says -ERANGE too). */
static int online_gate_set(const char *val, const struct kernel_param *kp)
{
	int err = param_set_uint_minmax(val, kp, GATE_NEVER, GATE_ALWAYS);

	return err ? -EINVAL : 0;
}

static const struct kernel_param_ops online_gate_ops = {
	.set = online_gate_set,
	.get = param_get_uint,
};

module_param_cb(online_gate, &online_gate_ops, &online_gate, 0644);
MODULE_PARM_DESC(online_gate,
		 "Offline cgroups closed while online work runs: 0 none, 1 those the class timeslice does not preempt, 2 all");

static unsigned int owed_ms = 20;
module_param(owed_ms, uint, 0644);
MODULE_PARM_DESC(owed_ms,
		 "A cgroup closed with fetched work goes ahead of others for this much open time, ms");

#define MAX_CHANGES 256
#define CH_RETRY_MIN_MS	10
#define CH_RETRY_MAX_MS	1000
#define UNLOAD_TRIES	5

struct change {
	struct qgpu_obj *obj;		/* in_change while listed here */
	u32 client;
	u32 channel;
	bool disable;
	bool ok;			/* RM answered NV_OK */
};

/*
 * A compute TSG of a cgroup being closed while owed, read before and after the close (apply()):
 * whether the close took a kernel off the engine mid-work (took_off()).
 */
#define MAX_PROBES 16

struct probe {
	u64 cg;				/* the cgroup's id */
	u32 client;
	u32 subdevice;			/* the client's, on this GPU */
	u32 tsg;
	u32 before;
	u32 after;
	bool read;			/* RM answered both reads */
};

struct qgpu_sched {
	u32 gpu;
	u8 policy;
	u32 period_us;
	struct task_struct *thread;
	wait_queue_head_t wq;
	bool kicked;

	bool rm_open;
	u32 hclient;
	u32 hsubdevice;

	ktime_t last;
	ktime_t closed_at;		/* apply(): when RM answered this pass's closes */
	ktime_t opened_at;		/* and its opens */
	ktime_t period_end;
	ktime_t online_seen;
	bool online_busy;
	u64 holder;			/* cgroup id of the offline cgroup that has the GPU */
	u64 ran;			/* offline cgroup that had it last; 0: online since */
	u64 nr_periods;
	u64 switches;
	u64 passes;
	u64 userd_reads;
	u64 rm_errors;
	u64 wake_in_ns;
	bool deferred;			/* this period's refill waits for a late turn */

	unsigned int nr_changes;
	struct change changes[MAX_CHANGES];
	unsigned int nr_probes;
	struct probe probes[MAX_PROBES];
};

static struct qgpu_sched *scheds[QGPU_MAX_GPUS];

static bool gated_here(const struct qgpu_sched *s, const struct qgpu_cg *cg)
{
	return cg->configured && cg->gpu == s->gpu;
}

static u32 weight(const struct qgpu_sched *s, const struct qgpu_cg *cg)
{
	return s->policy == QGPU_POLICY_BEST_EFFORT ? 1 : cg->share;
}

/*
 * A slice ends at the first look after it ran out, so it overruns a little; the overrun is
 * owed and comes off the next slice, as CFS bandwidth carries runtime debt. Time a busy cgroup
 * could not use before the period ended (its turn came late) is carried too, up to
 * CARRY_MAX_NS; an idle cgroup's unused time does not keep.
 */
#define CARRY_MAX_NS	(2 * NSEC_PER_MSEC)

static s64 carry(const struct qgpu_cg *cg)
{
	return min_t(s64, cg->slice_ns, cg->busy ? CARRY_MAX_NS : 0);
}

/*
 * Split @ns by weight among the offline cgroups busy in this period (burst-share,
 * best-effort); one whose ring is dry for a moment keeps its part.
 */
static void split(struct qgpu_sched *s, u64 ns)
{
	struct qgpu_cg *cg;
	u64 total = 0;

	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (gated_here(s, cg) && cg->class == QGPU_CLASS_OFFLINE && cg->busy_in_period)
			total += weight(s, cg);
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (!gated_here(s, cg) || cg->class != QGPU_CLASS_OFFLINE)
			continue;
		cg->slice_ns = carry(cg) +
			(cg->busy_in_period && total ? div64_u64(ns * weight(s, cg), total) : 0);
	}
}

static void refill(struct qgpu_sched *s)
{
	u64 period_ns = (u64)s->period_us * NSEC_PER_USEC;
	struct qgpu_cg *cg;

	if (s->policy != QGPU_POLICY_FIXED_SHARE) {
		split(s, period_ns);
		return;
	}
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (gated_here(s, cg) && cg->class == QGPU_CLASS_OFFLINE)
			cg->slice_ns = carry(cg) + div_u64(period_ns * cg->share, 100);
}

/*
 * Fixed-share: whether a busy offline cgroup still has slice left from this period, its turn not
 * yet come or not yet over. Where the turns and their context switches take longer than the
 * period, a refill at the period's end would cut that slice down to the carry and hand a whole
 * new one to whoever's turn it is, so the order of the turns and not the shares would decide
 * who gets the GPU: with 3 ms switches, 50/30/20 came out 47.2/33.3/19.5 in one VM run. The
 * refill waits until every busy cgroup has had its slice (a round of turns), and the next period
 * begins at the refill, so that a cgroup still never gets more than its share of any period.
 */
static bool slices_owed(const struct qgpu_sched *s)
{
	struct qgpu_cg *cg;

	if (s->policy != QGPU_POLICY_FIXED_SHARE)
		return false;
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (gated_here(s, cg) && cg->class == QGPU_CLASS_OFFLINE && cg->busy &&
		    cg->slice_ns > 0)
			return true;
	return false;
}

static struct qgpu_cg *find_holder(struct qgpu_sched *s)
{
	struct qgpu_cg *cg;

	if (!s->holder)
		return NULL;
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (cg->id == s->holder && gated_here(s, cg) && cg->class == QGPU_CLASS_OFFLINE)
			return cg;
	return NULL;
}

/* The next busy offline cgroup with slice left, in list order after @after (round robin). */
static struct qgpu_cg *next_holder(struct qgpu_sched *s, struct qgpu_cg *after)
{
	struct qgpu_cg *cg, *first = NULL;
	bool passed = !after;

	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (cg == after) {
			passed = true;
			continue;
		}
		if (!gated_here(s, cg) || cg->class != QGPU_CLASS_OFFLINE || !cg->busy ||
		    cg->slice_ns <= 0)
			continue;
		if (passed)
			return cg;
		if (!first)
			first = cg;
	}
	return first;
}

/*
 * A cgroup closed after its work was fetched may have a kernel taken off the GPU unfinished
 * (FIFO_DISABLE_CHANNELS preempts running work), and nothing in its USERD shows that: GP_GET
 * has caught up and moves no more while it is closed, and no other word of USERD stays behind
 * while a fetched kernel runs (measured on an H100: the pushbuffer's Get reaches its Put with
 * GP_GET, TopLevelGet does not move; tools/gpu/userd_fetch.py). A loop that waits for that
 * kernel submits nothing more, so the cgroup would read idle for ever and, next to a busy one,
 * never be opened again: its process hangs. Such a cgroup is owed until GP_GET moves again
 * while it is open (its work went on). Work is also fetched between the look that decided a
 * close and the close itself (FIFO_DISABLE_CHANNELS takes 0.5-0.8 ms on a GSP GPU,
 * h200-findings.md section 2): GP_GET then moves while the cgroup is closed, which makes it owed
 * as well.
 *
 * An owed cgroup counts as busy, ahead of others' work, for owed_ms of open time with nothing
 * moving: whatever was taken off had that time to finish, or there was none. A pass that came
 * late counts as OWED_PASS_MAX_NS at most: a host too busy to run this thread on time may not
 * have run the owed work either. Past owed_ms the cgroup stays owed but has only the time no
 * one else could use (owed_idle()), so a process that went quiet holds no one up for longer;
 * under burst-share and best-effort, where that time may never come, it is owed owed_ms again
 * now and then (owed_again()).
 * Context: qgpu_lock held.
 * Return: whether the cgroup counts as busy ahead of others' work.
 */
#define OWED_PASS_MAX_NS	(2 * NSEC_PER_MSEC)

/* Whether an owed cgroup has had its owed_ms of open time. */
static bool owed_spent(const struct qgpu_cg *cg)
{
	return cg->owed_open_ns >= (u64)owed_ms * NSEC_PER_MSEC;
}

static bool owed(struct qgpu_cg *cg, u64 dt)
{
	lockdep_assert_held(&qgpu_lock);
	if (cg->class != QGPU_CLASS_OFFLINE || (cg->moved && cg->open)) {
		cg->owed = false;
	} else if (cg->moved) {
		cg->owed = true;
		cg->owed_open_ns = 0;
	}
	/* Its work moved, or it is owed no more: what owed_again() kept ends with that. */
	if (cg->moved || !cg->owed) {
		cg->owed_beside = false;
		cg->owed_every = 0;
		cg->owed_wait = 0;
	}
	if (!cg->owed)
		return false;
	if (cg->open)
		cg->owed_open_ns += min_t(u64, dt, OWED_PASS_MAX_NS);
	if (owed_spent(cg))
		cg->owed_beside = false;
	return !cg->owed_beside && !owed_spent(cg);
}

/*
 * Under burst-share and best-effort a cgroup past owed_ms (owed()) has only what no one else
 * could use, which next to work that never pauses is nothing: a kernel taken off unfinished
 * would wait for ever (a loop of 40 ms kernels beside a saturating pod never finished its first
 * in the VM). So at period boundaries such a cgroup is owed owed_ms of open time again, at
 * spacings that double up to OWED_EVERY_MAX periods as long as nothing of it moves (owed() then
 * ends it).
 *
 * Where its TSGs keep a timeslice of their own it is opened beside the holder for that time,
 * not counted busy, and the GPU's time-slicing between their TSGs runs its kernel on; a process
 * that went quiet has nothing there to switch to and costs the holder nothing but the two
 * controls, so this starts one period after it passed owed_ms. Where its TSGs hold qgpu's short
 * offline timeslice (timeslice.c) two TSGs with work would switch at every slice and neither
 * run, so it gets a turn of its own from this period's split instead, which leaves the GPU idle
 * for owed_ms if the process went quiet: these start OWED_TURN_FIRST periods after (beside a pod
 * asking for 1 ms twice a second, a busy one kept 0.78 of its time alone in the VM with turns 1,
 * 2, 4 ... periods apart, 0.85-0.87 from 4 on, 0.90-0.93 with the pod opened beside it and 0.92
 * before any of this).
 * Fixed-share needs none of this: there an owed cgroup keeps its own share (owed_idle()).
 * Context: qgpu_lock held; at a period boundary, before the refill.
 */
#define OWED_TURN_FIRST		4
#define OWED_EVERY_MAX		64

static void owed_again(struct qgpu_sched *s, struct qgpu_cg *cg)
{
	lockdep_assert_held(&qgpu_lock);
	if (!cg->owed || cg->owed_beside || s->policy == QGPU_POLICY_FIXED_SHARE ||
	    !owed_spent(cg))
		return;
	if (!cg->owed_every) {
		cg->owed_every = cg->ts_preempted ? OWED_TURN_FIRST : 1;
		cg->owed_wait = cg->owed_every;
	}
	if (--cg->owed_wait)
		return;
	cg->owed_open_ns = 0;
	if (cg->ts_preempted)
		cg->busy = true;
	else
		cg->owed_beside = true;
	cg->owed_every = min(2 * cg->owed_every, OWED_EVERY_MAX);
	cg->owed_wait = cg->owed_every;
}

/*
 * Owed cgroups past owed_ms (owed()) count as busy when no other gated cgroup here could have
 * the GPU: none is busy, or, under fixed-share, none busy has slice left (the rest of such a
 * period goes to no one). Under fixed-share an owed cgroup thus still has its own share, after
 * the others' turns, and no more.
 * Context: qgpu_lock held; after the pass's refill, before its holder is chosen.
 */
static void owed_idle(struct qgpu_sched *s)
{
	struct qgpu_cg *cg;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (!gated_here(s, cg) || !cg->busy)
			continue;
		if (cg->class == QGPU_CLASS_ONLINE || s->policy != QGPU_POLICY_FIXED_SHARE ||
		    cg->slice_ns > 0)
			return;
	}
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (gated_here(s, cg) && cg->owed && !cg->busy) {
			cg->busy = true;
			cg->owed_only = true;
		}
	}
}

/*
 * Which gated cgroups count as busy at this pass. Channels of ungated cgroups are not read (no
 * one schedules them), and a cgroup's channels are read only until one shows work pending: the
 * hold that follows is the cgroup's (qgpu_cg_busy()). A pass thus reads one channel of each busy
 * cgroup and, of the idle ones, every warm channel and the cold ones due (userd.c), each a PCIe
 * round trip on a real GPU.
 *
 * A cgroup given the GPU after another cgroup had it has started once its work is seen on the
 * GPU: GP_GET moved in a channel read (the GPU fetched from it) or nothing of it waits to be
 * fetched. Until then the GPU is switching to it, which is charged to no one's slice.
 */
static void sense(struct qgpu_sched *s, ktime_t now, u64 dt)
{
	struct qgpu_obj *obj;
	struct qgpu_cg *cg;

	lockdep_assert_held(&qgpu_lock);
	s->passes++;
	/* Every gated cgroup's busy is false here (step()): now "a channel showed work". */
	list_for_each_entry(cg, &qgpu_cgroups, node)
		cg->moved = false;
	list_for_each_entry(obj, &qgpu_gpu_channels[s->gpu], gpu_node) {
		unsigned int look;

		cg = obj->client->cg;
		if (!gated_here(s, cg) || cg->busy)
			continue;
		look = qgpu_channel_look(cg, obj, ktime_to_ns(now));
		s->userd_reads += !!(look & QGPU_LOOK_READ);
		cg->busy = look & QGPU_LOOK_PENDING;
		cg->moved |= look & QGPU_LOOK_MOVED;
	}
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (!gated_here(s, cg))
			continue;
		/*
		 * Work first seen moving began at some time since the previous look: half the
		 * interval is its expected share of it, charged now (an open offline holder's).
		 */
		if (!cg->started && cg->moved && cg->open && cg->class == QGPU_CLASS_OFFLINE)
			cg->slice_ns -= dt / 2;
		if (cg->moved || !cg->busy || ktime_us_delta(now, cg->opened) >= start_grace_us)
			cg->started = true;
		/*
		 * GP_GET moved since the previous look: the GPU fetched work of it in between, so
		 * it had work then, though a loop that waits for each result shows GP_PUT !=
		 * GP_GET only for the few us between a launch and its fetch (measured on an H100:
		 * 0.3 % and 4.5 % of such loops' time, tools/gpu/userd_fetch.py). That holds the
		 * cgroup busy as a pending channel does.
		 */
		cg->moved_in_turn |= cg->moved;
		cg->busy = qgpu_cg_busy(cg, cg->busy || cg->moved, dt);
		cg->busy |= owed(cg, dt);
	}
}

/*
 * Queue a control for every channel on this GPU whose state differs from its cgroup's plan, up
 * to MAX_CHANGES. One that failed lately waits for its retry time unless @now.
 */
static void plan_channels(struct qgpu_sched *s, bool now)
{
	struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(obj, &qgpu_gpu_channels[s->gpu], gpu_node) {
		struct qgpu_cg *cg = obj->client->cg;
		bool open = gated_here(s, cg) ? cg->open : true;
		struct change *c;

		if (obj->enabled == open || obj->in_change)
			continue;
		if (!now && obj->ch_failures && time_before(jiffies, obj->ch_retry))
			continue;
		if (s->nr_changes == MAX_CHANGES)
			return;
		c = &s->changes[s->nr_changes++];
		c->obj = obj;
		c->client = obj->client->handle;
		c->channel = obj->handle;
		c->disable = !open;
		c->ok = false;
		obj->in_change = true;
	}
}

/*
 * After apply(): what RM carried out becomes the channels' state; a failure is retried later.
 * Channels untracked meanwhile are freed here. A closed offline cgroup ran until RM answered
 * (FIFO_DISABLE_CHANNELS returns once none of the channels runs on the engine), @tail_ns after
 * the pass decided to close it: that is its time too, and comes off its slice. Left uncharged,
 * a fixed cost per turn went to every turn's owner alike, which favours small shares: with
 * 3 ms switches 50/30/20 came out about 48.5/30.4/21.1 in the VM. The GR reads after the close
 * (read_probes()) are not: the cgroup no longer runs.
 * An opened one could run only once RM answered, @head_ns after the pass decided to open it.
 * Where its slice runs down from that decision (a turn after its own, step()), the next pass
 * would charge the open's wait as its time: it is given back here. Left charged, a lone
 * fixed-share pod lost an open (0.37-0.45 ms on an H200, call 34A) and the GR read after each
 * close (0.29 ms) of every 50 ms period: 26.6-26.8 % of wall time for a 30 % pod in the VM at
 * nvmock's H200 times, against 28.5-28.7 % with controls answered at once (2026-12-04).
 * Return: how many RM carried out.
 */
static u32 settle(struct qgpu_sched *s, u64 tail_ns, u64 head_ns)
{
	struct qgpu_cg *cg;
	u32 i, done = 0;

	lockdep_assert_held(&qgpu_lock);
	for (i = 0; i < s->nr_changes; i++) {
		struct change *c = &s->changes[i];
		struct qgpu_obj *obj = c->obj;

		obj->in_change = false;
		done += c->ok;
		if (obj->dead) {
			kfree(obj);
			continue;
		}
		if (c->ok) {
			obj->enabled = !c->disable;
			obj->ch_failures = 0;
			obj->client->cg->closing |= c->disable;
			obj->client->cg->opening |= !c->disable;
			continue;
		}
		if (obj->ch_failures < 16)
			obj->ch_failures++;
		obj->ch_retry = jiffies +
			msecs_to_jiffies(min(CH_RETRY_MIN_MS << (obj->ch_failures - 1),
					     CH_RETRY_MAX_MS));
	}
	s->nr_changes = 0;
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (cg->closing && gated_here(s, cg) && cg->class == QGPU_CLASS_OFFLINE &&
		    !cg->open && cg->busy)
			cg->slice_ns -= tail_ns;
		if (cg->opening && gated_here(s, cg) && cg->class == QGPU_CLASS_OFFLINE &&
		    cg->open && cg->busy && cg->started)
			cg->slice_ns += head_ns;
		/* Its start grace (sense()) counts from RM's answer too. */
		if (cg->opening && head_ns)
			cg->opened = s->opened_at;
		cg->closing = false;
		cg->opening = false;
	}
	return done;
}

/*
 * Read @cg's compute TSGs on this GPU around the close step() is about to send. A cgroup is owed
 * when it is closed after its work was fetched (owed()), for it may have a kernel taken off
 * unfinished, which USERD cannot tell (userd.c). GR can: a context taken off the engine with a
 * kernel running is saved by CILP, once a close, and one with nothing to run is not saved at all
 * (measured on an H100 and an H200: kmod/nvmock/CONFORMANCE.md, the engine). Such a close makes
 * the cgroup owed in full again (took_off()). A close that saved nothing changes nothing here:
 * work fetched and not yet started may not be saved either (not measured), and owed() then
 * keeps it from hanging.
 */
static void probe_close(struct qgpu_sched *s, const struct qgpu_cg *cg)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(client, &qgpu_clients, node) {
		u32 subdevice;

		if (client->cg != cg)
			continue;
		subdevice = qgpu_client_subdevice(client, s->gpu);
		if (!subdevice)
			continue;
		list_for_each_entry(obj, &client->objects, node) {
			struct probe *p;

			if (obj->kind != QGPU_OBJ_TSG || !obj->computes || obj->gpu != (int)s->gpu)
				continue;
			if (s->nr_probes == MAX_PROBES)
				return;
			p = &s->probes[s->nr_probes++];
			*p = (struct probe){ .cg = cg->id, .client = client->handle,
					     .subdevice = subdevice, .tsg = obj->handle };
		}
	}
}

/* The probes' saves before (@after false) or after the closes. Without qgpu_lock. */
static void read_probes(struct qgpu_sched *s, bool after)
{
	u32 i;

	for (i = 0; i < s->nr_probes; i++) {
		struct probe *p = &s->probes[i];
		bool ok = qgpu_rmapi_preemption_saves(p->client, p->subdevice, p->tsg,
						      after ? &p->after : &p->before) == NV_OK;

		p->read = (after ? p->read : true) && ok;
	}
}

/* An owed cgroup whose close took a kernel off mid-work is owed owed_ms of open time afresh. */
static void took_off(struct qgpu_sched *s)
{
	u32 i;

	lockdep_assert_held(&qgpu_lock);
	for (i = 0; i < s->nr_probes; i++) {
		const struct probe *p = &s->probes[i];
		struct qgpu_cg *cg;

		if (!p->read || p->after == p->before)
			continue;
		cg = qgpu_cg_get(p->cg, false);
		if (!cg || !cg->owed || cg->open)
			continue;
		cg->owed_open_ns = 0;
		cg->owed_beside = false;
		cg->owed_every = 0;
		cg->owed_wait = 0;
	}
	s->nr_probes = 0;
}

/* Whether every channel on this GPU is open, as RM last carried out. */
static bool all_open(struct qgpu_sched *s)
{
	struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(obj, &qgpu_gpu_channels[s->gpu], gpu_node)
		if (!obj->enabled)
			return false;
	return true;
}

/* Whether @cg is kept closed for online work at this pass (online_gate, read once as @gate). */
static bool shut(const struct qgpu_sched *s, unsigned int gate, const struct qgpu_cg *cg)
{
	if (!s->online_busy || gate == GATE_NEVER)
		return false;
	return gate == GATE_ALWAYS || !cg->ts_preempted;
}

/* One pass; false when nothing on this GPU is gated and every channel is open. */
static bool step(struct qgpu_sched *s, ktime_t now)
{
	u64 dt = s->last ? ktime_to_ns(ktime_sub(now, s->last)) : 0;
	u64 period_ns = (u64)s->period_us * NSEC_PER_USEC;
	struct qgpu_cg *cg, *holder;
	unsigned int gate = READ_ONCE(online_gate);
	bool any = false, online_now = false, ended, held;

	lockdep_assert_held(&qgpu_lock);
	s->last = now;
	s->nr_changes = 0;
	s->nr_probes = 0;
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (!gated_here(s, cg))
			continue;
		any = true;
		if (cg->busy) {
			if (cg->open) {
				cg->open_ns += dt;
				if (cg->class == QGPU_CLASS_OFFLINE && cg->started)
					cg->slice_ns -= dt;
			} else if (!cg->owed_only && !cg->owed_every) {
				/*
				 * Owed only, or owed again (owed_again()): whether it has work
				 * at all is unknown.
				 */
				cg->throttled_ns += dt;
				cg->throttled_in_period = true;
			}
		}
		cg->busy = false;
		cg->owed_only = false;
	}
	if (!any) {
		s->holder = 0;
		s->last = 0;
		s->period_end = 0;
		plan_channels(s, false);
		s->wake_in_ns = (u64)clamp(qgpu_poll_us, 50U, 5000U) * NSEC_PER_USEC;
		/* Stay awake while channels wait to be reopened, even ones backing off. */
		return s->nr_changes > 0 || !all_open(s);
	}

	sense(s, now, dt);
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (!gated_here(s, cg))
			continue;
		cg->busy_in_period |= cg->busy;
		if (cg->busy && cg->class == QGPU_CLASS_ONLINE)
			online_now = true;
	}
	if (online_now)
		s->online_seen = now;
	s->online_busy = online_now ||
		(s->online_seen && ktime_us_delta(now, s->online_seen) < online_hold_us);

	ended = !s->period_end || ktime_after(now, s->period_end);
	if (ended && s->period_end && slices_owed(s)) {
		s->deferred = true;
		ended = false;
	}
	if (ended) {
		list_for_each_entry(cg, &qgpu_cgroups, node) {
			if (!gated_here(s, cg))
				continue;
			cg->nr_periods += cg->busy_in_period;
			cg->nr_throttled += cg->throttled_in_period;
			owed_again(s, cg);
			cg->busy_in_period = cg->busy;
			cg->throttled_in_period = false;
		}
		s->nr_periods++;
		if (!s->period_end || s->deferred ||
		    ktime_to_ns(ktime_sub(now, s->period_end)) > period_ns)
			s->period_end = ktime_add_ns(now, period_ns);
		else
			s->period_end = ktime_add_ns(s->period_end, period_ns);
		s->deferred = false;
		refill(s);
	}
	owed_idle(s);

	holder = find_holder(s);
	/* A holder whose ring ran dry at one look may be refilling it: it goes at the second. */
	if (holder) {
		holder->idle_looks = holder->busy ? 0 : holder->idle_looks + 1;
		if (holder->idle_looks == 1)
			holder->busy = true;
	}
	/*
	 * A holder kept closed for online work keeps its turn until it is over; one the GPU
	 * preempts by itself runs it out, and so may its successor.
	 */
	held = holder && shut(s, gate, holder);
	if (!held && (!holder || !holder->busy || holder->slice_ns <= 0)) {
		struct qgpu_cg *next = next_holder(s, holder);

		/* Work conserving: time the period still has, split again among the busy. */
		if (!next && s->policy != QGPU_POLICY_FIXED_SHARE) {
			split(s, ktime_to_ns(ktime_sub(s->period_end, now)));
			next = next_holder(s, holder);
		}
		if (next != holder)
			s->switches++;
		holder = next;
	}
	s->holder = holder ? holder->id : 0;
	held = holder && shut(s, gate, holder);
	/* Look again when the holder's slice runs out, if that comes before the next poll. */
	s->wake_in_ns = (u64)clamp(qgpu_poll_us, 50U, 5000U) * NSEC_PER_USEC;
	if (holder && !held)
		s->wake_in_ns = clamp_t(s64, holder->slice_ns, 20 * NSEC_PER_USEC, s->wake_in_ns);
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		bool open;

		if (!gated_here(s, cg))
			continue;
		open = cg->class == QGPU_CLASS_ONLINE || (cg == holder && !held) ||
		       (cg->owed_beside && !shut(s, gate, cg));
		/* Closed after its work was fetched, or still owed: see owed(). */
		if (!open && cg->open && (cg->moved_in_turn || cg->owed)) {
			if (!cg->owed)
				cg->owed_open_ns = 0;
			cg->owed = true;
			probe_close(s, cg);
		}
		if (open && !cg->open) {
			cg->moved_in_turn = false;
			/*
			 * A turn after someone else's begins with a context switch (sense());
			 * after a turn of its own the GPU has nothing to switch.
			 */
			cg->started = s->ran == cg->id;
			cg->opened = now;
		}
		cg->open = open;
	}
	/* Online work had the GPU since, unless an offline holder ran beside it. */
	if (held || (!holder && s->online_busy))
		s->ran = 0;
	else if (holder)
		s->ran = holder->id;
	plan_channels(s, false);
	return true;
}

static void apply_batch(struct qgpu_sched *s, struct change **c, u32 n, bool disable)
{
	u32 clients[NV2080_DISABLE_CHANNELS_MAX], channels[NV2080_DISABLE_CHANNELS_MAX];
	u32 i;

	for (i = 0; i < n; i++) {
		clients[i] = c[i]->client;
		channels[i] = c[i]->channel;
	}
	if (qgpu_rmapi_set_channels(s->hclient, s->hsubdevice, disable, clients, channels, n) ==
	    NV_OK) {
		for (i = 0; i < n; i++)
			c[i]->ok = true;
		return;
	}
	/*
	 * One channel freed meanwhile fails the batch, so go one by one. RM counts closes (an
	 * H200: a channel closed twice runs only after two opens), and whether GSP closed part of
	 * a batch it failed is not known: a failed close is first undone channel by channel, as an
	 * open of a channel not closed does nothing (measured likewise), so that none is closed
	 * twice.
	 */
	if (disable)
		for (i = 0; i < n; i++)
			qgpu_rmapi_set_channels(s->hclient, s->hsubdevice, false, &clients[i],
						&channels[i], 1);
	for (i = 0; i < n; i++) {
		c[i]->ok = qgpu_rmapi_set_channels(s->hclient, s->hsubdevice, disable, &clients[i],
						   &channels[i], 1) == NV_OK;
		if (!c[i]->ok)
			s->rm_errors++;
	}
}

/* Closing before opening, so two offline cgroups never run side by side. Without qgpu_lock. */
static void apply(struct qgpu_sched *s)
{
	struct change *batch[NV2080_DISABLE_CHANNELS_MAX];
	int pass;

	if (!s->nr_changes)
		return;
	if (!s->rm_open) {
		if (qgpu_rmapi_gpu_open(s->gpu, &s->hclient, &s->hsubdevice)) {
			s->rm_errors++;
			return;
		}
		s->rm_open = true;
	}
	read_probes(s, false);
	for (pass = 0; pass < 2; pass++) {
		bool disable = pass == 0;
		u32 i, n = 0;

		for (i = 0; i < s->nr_changes; i++) {
			if (s->changes[i].disable != disable)
				continue;
			batch[n++] = &s->changes[i];
			if (n == ARRAY_SIZE(batch)) {
				apply_batch(s, batch, n, disable);
				n = 0;
			}
		}
		if (n)
			apply_batch(s, batch, n, disable);
		if (disable)
			s->closed_at = ktime_get();
		else
			s->opened_at = ktime_get();
	}
	/*
	 * After the opens too: a closed TSG is saved no more, and the GPU does not wait for the
	 * read (a GSP round trip) to run the next cgroup; the read before only delays a close.
	 */
	read_probes(s, true);
}

static int sched_thread(void *data)
{
	struct qgpu_sched *s = data;

	sched_set_fifo_low(current);
	while (!kthread_should_stop()) {
		ktime_t now = ktime_get(), wake;
		bool active;

		mutex_lock(&qgpu_lock);
		active = step(s, now);
		mutex_unlock(&qgpu_lock);
		if (s->nr_changes) {
			s->closed_at = now;
			s->opened_at = now;
			apply(s);
			mutex_lock(&qgpu_lock);
			settle(s, ktime_to_ns(ktime_sub(s->closed_at, now)),
			       ktime_to_ns(ktime_sub(s->opened_at, now)));
			took_off(s);
			mutex_unlock(&qgpu_lock);
		}
		if (!active) {
			if (s->rm_open) {
				qgpu_rmapi_gpu_close(s->hclient);
				s->rm_open = false;
			}
			wait_event_interruptible(s->wq,
						 READ_ONCE(s->kicked) || kthread_should_stop());
			WRITE_ONCE(s->kicked, false);
			continue;
		}
		wake = ktime_add_ns(now, s->wake_in_ns);
		set_current_state(TASK_INTERRUPTIBLE);
		if (!kthread_should_stop())
			schedule_hrtimeout_range(&wake, 20 * NSEC_PER_USEC, HRTIMER_MODE_ABS);
		__set_current_state(TASK_RUNNING);
	}
	return 0;
}

/*
 * Every channel back open and the kernel client freed: what unloading leaves behind. The hooks
 * are gone, so no channel is added; pass after pass until none is left closed, or RM has
 * refused every call of UNLOAD_TRIES passes in a row.
 */
static void sched_release(struct qgpu_sched *s)
{
	struct qgpu_cg *cg;
	u32 planned, done, reopened = 0, stuck = 0;

	mutex_lock(&qgpu_lock);
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (gated_here(s, cg))
			cg->open = true;
	mutex_unlock(&qgpu_lock);
	while (stuck < UNLOAD_TRIES) {
		mutex_lock(&qgpu_lock);
		s->nr_changes = 0;
		plan_channels(s, true);
		planned = s->nr_changes;
		mutex_unlock(&qgpu_lock);
		if (!planned)
			break;
		apply(s);
		mutex_lock(&qgpu_lock);
		done = settle(s, 0, 0);
		mutex_unlock(&qgpu_lock);
		reopened += done;
		stuck = done ? 0 : stuck + 1;
	}
	if (stuck)
		pr_err("gpu%u: %u channels reopened, some stay closed: RM refused %u passes\n",
		       s->gpu, reopened, stuck);
	if (s->rm_open)
		qgpu_rmapi_gpu_close(s->hclient);
	s->rm_open = false;
}

/**
 * qgpu_sched_init() - a scheduler per GPU; its thread only where the RM entry is bound
 *
 * Context: module init, before the hooks.
 * Return: 0, or -ENOMEM or a kthread error (nothing is left behind).
 */
int qgpu_sched_init(void)
{
	int i, err;

	for (i = 0; i < QGPU_MAX_GPUS; i++) {
		struct qgpu_sched *s = kzalloc(sizeof(*s), GFP_KERNEL);

		if (!s) {
			err = -ENOMEM;
			goto err_free;
		}
		s->gpu = i;
		s->policy = QGPU_POLICY_BEST_EFFORT;
		s->period_us = QGPU_PERIOD_DEFAULT_US;
		init_waitqueue_head(&s->wq);
		scheds[i] = s;
		if (!qgpu_rmapi_available())
			continue;
		s->thread = kthread_run(sched_thread, s, "qgpu/gpu%d", i);
		if (IS_ERR(s->thread)) {
			err = PTR_ERR(s->thread);
			s->thread = NULL;
			goto err_free;
		}
	}
	return 0;

err_free:
	qgpu_sched_exit();
	return err;
}

/**
 * qgpu_sched_exit() - stop the schedulers, every channel they closed reopened first
 *
 * Context: module exit, after the hooks are gone; takes qgpu_lock.
 */
void qgpu_sched_exit(void)
{
	int i;

	for (i = 0; i < QGPU_MAX_GPUS; i++) {
		struct qgpu_sched *s = scheds[i];

		if (!s)
			continue;
		if (s->thread) {
			kthread_stop(s->thread);
			sched_release(s);
		}
		kfree(s);
		scheds[i] = NULL;
	}
}

/**
 * qgpu_sched_kick() - wake a GPU's scheduler: its configuration or its cgroups changed
 * @gpu: the GPU; out of range does nothing
 *
 * Context: any process context; qgpu_lock may or may not be held.
 */
void qgpu_sched_kick(u32 gpu)
{
	struct qgpu_sched *s = gpu < QGPU_MAX_GPUS ? scheds[gpu] : NULL;

	if (!s)
		return;
	WRITE_ONCE(s->kicked, true);
	wake_up(&s->wq);
}

/**
 * qgpu_sched_kick_all() - wake every GPU's scheduler: which cgroup governs which changed
 *
 * Context: any process context; qgpu_lock may or may not be held.
 */
void qgpu_sched_kick_all(void)
{
	u32 gpu;

	for (gpu = 0; gpu < QGPU_MAX_GPUS; gpu++)
		qgpu_sched_kick(gpu);
}

/**
 * qgpu_sched_check_shares() - whether fixed-share caps fit in the period
 * @gpu: the GPU
 * @policy: the policy the GPU would run
 * @skip_cg: a cgroup whose share is left out (it is being replaced), or 0
 * @extra_share: a share to add (the replacement)
 *
 * The shares of one GPU sum to at most QGPU_SHARE_MAX under fixed-share.
 *
 * Context: qgpu_lock held.
 * Return: 0 if they fit (or the policy is not fixed-share), else -EINVAL.
 */
int qgpu_sched_check_shares(u32 gpu, u8 policy, u64 skip_cg, u32 extra_share)
{
	struct qgpu_cg *cg;
	u32 sum = extra_share;

	lockdep_assert_held(&qgpu_lock);
	if (policy != QGPU_POLICY_FIXED_SHARE)
		return 0;
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (cg->configured && cg->gpu == gpu && cg->id != skip_cg)
			sum += cg->share;
	return sum > QGPU_SHARE_MAX ? -EINVAL : 0;
}

/**
 * qgpu_sched_set_gpu() - set a GPU's policy and period
 * @gpu: the GPU
 * @policy: enum qgpu_policy, or < 0 to leave it
 * @period_us: the period, or < 0 to leave it
 *
 * All or nothing. The caller kicks the scheduler once qgpu_lock is dropped.
 *
 * Context: qgpu_lock held.
 * Return: 0, or -EINVAL for a bad GPU, policy or period, or shares that would not fit.
 */
int qgpu_sched_set_gpu(u32 gpu, int policy, int period_us)
{
	struct qgpu_sched *s;

	lockdep_assert_held(&qgpu_lock);
	if (gpu >= QGPU_MAX_GPUS || !scheds[gpu])
		return -EINVAL;
	s = scheds[gpu];
	if (policy >= 0) {
		if (policy > QGPU_POLICY_BURST_SHARE ||
		    qgpu_sched_check_shares(gpu, policy, 0, 0))
			return -EINVAL;
	}
	if (period_us >= 0 && (period_us < QGPU_PERIOD_MIN_US || period_us > QGPU_PERIOD_MAX_US))
		return -EINVAL;
	if (policy >= 0)
		s->policy = policy;
	if (period_us >= 0)
		s->period_us = period_us;
	s->period_end = 0;	/* the next pass starts a period under the new rules */
	return 0;
}

/**
 * qgpu_sched_view() - a GPU's scheduler state, for GPU_GET and sysfs
 * @gpu: the GPU, < QGPU_MAX_GPUS
 * @view: filled in
 *
 * Context: qgpu_lock held.
 */
void qgpu_sched_view(u32 gpu, struct qgpu_gpu_view *view)
{
	struct qgpu_sched *s = scheds[gpu];

	lockdep_assert_held(&qgpu_lock);
	view->policy = s->policy;
	view->period_us = s->period_us;
	view->nr_periods = s->nr_periods;
	view->switches = s->switches;
	view->passes = s->passes;
	view->userd_reads = s->userd_reads;
	view->online_busy = s->online_busy;
	view->running = !!s->thread;
	view->timeslice_us[QGPU_CLASS_OFFLINE] = qgpu_timeslice_get(gpu, QGPU_CLASS_OFFLINE);
	view->timeslice_us[QGPU_CLASS_ONLINE] = qgpu_timeslice_get(gpu, QGPU_CLASS_ONLINE);
	view->offline_preemption = qgpu_timeslice_preemption(gpu);
}
