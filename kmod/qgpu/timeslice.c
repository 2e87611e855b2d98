// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the timeslice of each gated TSG, by its cgroup's class, while its GPU has online work.
 *
 * The lever measured on an H100 and an H200 (580.159.04, tools/gpu/results/
 * 2026-11-24-doctor-h100.json and -h200.json): offline TSGs at 128 us and online TSGs at
 * 8192 us took an online pod's p99 from 2.9 to 1.0 ms next to a trainer, which kept its
 * throughput; 1 us offline, the default since 2026-11-26, did as well or better wherever both
 * ran on one host (BENCHMARKS.md). The GPU keeps a timeslice once it is set, so this costs a
 * control per TSG and change, not per request (per-request controls cost 0.6-1.3 ms each under
 * GSP).
 *
 * What a TSG gets (wanted()):
 *   - its class's value on its GPU, when its cgroup is configured for that GPU, the GPU has at
 *     least one configured online cgroup, the value is not 0, and the cgroup's TSGs on that GPU
 *     are one CUDA context's (count_contexts());
 *   - otherwise its own timeslice: what RM held before qgpu's first SET_TIMESLICE (read with
 *     GET_TIMESLICE just before it), or the one its tenant asked for since. The tenant guard
 *     (ioctl.c) swallows a gated tenant's SET_TIMESLICE; the value becomes the TSG's own, to be
 *     carried out once qgpu restores the TSG or its cgroup is no longer gated.
 *
 * The controls go through the driver's kernel RM entry (rmapi.c), to the tenant's own TSG, from
 * a work item: process context, outside qgpu_lock (RM sleeps and takes its own locks). A pass
 * plans under the lock, calls RM without it and records under it what RM answered NV_OK to; an
 * error is retried later, each TSG backing off on its own. A tenant's request that reaches RM
 * while a pass is out (its cgroup was not gated when it was sent) changes ts_gen, and the pass
 * plans that TSG again rather than record what may no longer hold.
 *
 * Unloading restores every TSG qgpu set (and carries out what tenants asked for meanwhile),
 * after the hooks and the schedulers are gone, before the RM entry is put back.
 *
 * The same pass sets a second lever of the same class decision, where the GPU's offline
 * preemption is CTA (the daemon's cta+timeslice strategy, chosen from the doctor's findings):
 * an offline TSG that gets its class's timeslice and holds a compute object also gets CTA compute
 * preemption (wanted_mode()), which waits for the running thread blocks instead of saving them
 * mid-kernel as CUDA's CILP does. Measured by the doctor: next to a trainer of 24 us kernels the
 * online p50 0.00-0.05 ms lower than the timeslices alone; next to one of 1.4 ms kernels twice as
 * high (README.md; docs/levers.md), so it is never the default. The mode is read with
 * GR_GET_CTXSW_MODES before the first set and given back as the timeslice is. The controls name
 * the context by one compute channel, and go to the tenant's own subdevice: on an H200, CTA set
 * through one of a trainer's eight compute channels was read back on all eight and turned its
 * saves to CTA, as the doctor's set of every channel had (tools/gpu/preemption_modes.py, call
 * 32A). CUDA's own CILP request for a gated context passes the tenant guard (ioctl.c); once
 * RM has carried it out it is the context's own, and the next pass sets qgpu's mode again.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/jiffies.h>
#include <linux/lockdep.h>
#include <linux/minmax.h>
#include <linux/mutex.h>
#include <linux/printk.h>
#include <linux/workqueue.h>

#include "qgpu.h"

#define BATCH		32
#define RETRY_MS	100
#define RETRY_MAX_SHIFT	6		/* backing off up to 6.4 s */
#define EXIT_RETRIES	3

/* [gpu][class]: us, 0 for the TSG's own; under qgpu_lock. */
static u32 values[QGPU_MAX_GPUS][2];
/* [gpu]: enum qgpu_preemption, for offline TSGs holding their class's value; under qgpu_lock. */
static u8 preemption[QGPU_MAX_GPUS];
/* Under qgpu_lock: unloading, every TSG gets its own back. */
static bool releasing;
/* Under qgpu_lock: stamps of planned changes and of tenants' requests, never 0. */
static u32 gen_counter;

struct change {
	u32 client;
	u32 tsg;
	u32 gen;
	/* the timeslice, where ts is set */
	bool ts;
	u64 value;		/* to set */
	bool restore;		/* value is the TSG's own */
	bool read_own;		/* GET_TIMESLICE first: its own is not known yet */
	bool own_read;
	u64 own;
	u32 status;
	/* the compute preemption mode, where pm is set */
	bool pm;
	u32 subdevice;		/* the client's, on the TSG's GPU */
	u32 channel;		/* the TSG's compute channel, or the TSG to restore one with none */
	u32 mode;		/* NV2080_CTXSW_PREEMPTION_COMPUTE_*, to set */
	bool pm_restore;	/* mode is the context's own */
	bool pm_read_own;	/* GR_GET_CTXSW_MODES first */
	bool pm_own_read;
	u32 pm_own;
	u32 pm_status;
};

/* Used by one pass at a time: the work item does not run concurrently with itself. */
static struct change batch[BATCH];

enum pass_result { PASS_DONE, PASS_MORE, PASS_RETRY };

static void ts_work_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(ts_work, ts_work_fn);

static u32 next_gen(void)
{
	lockdep_assert_held(&qgpu_lock);
	if (!++gen_counter)
		++gen_counter;
	return gen_counter;
}

static bool gated(const struct qgpu_cg *cg)
{
	return cg->configured && !releasing;
}

static void online_gpus(bool *online)
{
	struct qgpu_cg *cg;
	int gpu;

	lockdep_assert_held(&qgpu_lock);
	for (gpu = 0; gpu < QGPU_MAX_GPUS; gpu++)
		online[gpu] = false;
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (gated(cg) && cg->class == QGPU_CLASS_ONLINE && cg->gpu < QGPU_MAX_GPUS)
			online[cg->gpu] = true;
}

/* Whether @client has TSGs on its cgroup's GPU; adds their compute objects to @computing. */
static bool client_tsgs(const struct qgpu_client *client, u32 *computing)
{
	const struct qgpu_obj *obj;
	bool tsgs = false;

	list_for_each_entry(obj, &client->objects, node) {
		if (obj->kind != QGPU_OBJ_TSG || obj->gpu < 0 || (u32)obj->gpu != client->cg->gpu)
			continue;
		tsgs = true;
		if (computing)
			*computing += obj->computes;
	}
	return tsgs;
}

/*
 * Which cgroups have more than one CUDA context on their GPU. A class's timeslice is for a
 * cgroup's TSGs against other cgroups'; busy contexts of one cgroup given it switch against each
 * other at every slice, and a compute context switch costs ~0.4 ms: two 8192 trainers of one
 * offline pod kept 0.04 % of their native throughput at 1 us and 24 % at 128 us on an H100
 * (BENCHMARKS.md, 2026-11-26, sixth session). They keep their own (CUDA's 1-2 ms). A context is
 * a TSG with a compute object (track.c; CUDA's shape is four TSGs, one computing); a process
 * whose TSGs have none yet is one context, so two processes are several whatever they hold,
 * and so is one process with two computing TSGs.
 *
 * Except beside an MPS server: where a cgroup holds one (client->mps_server), its processes
 * without a compute object are its clients, whose kernels run in its context, and count as
 * none; the cgroup is several only with more than one computing TSG. Two 8192 trainers of one
 * offline pod run so kept the lever and 102-103 % of their native throughput on an H100 and an
 * H200 (the rm enforcer's rule; BENCHMARKS.md, 2026-11-27, twelfth session).
 */
static void count_contexts(void)
{
	struct qgpu_client *client;
	struct qgpu_cg *cg;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		cg->ts_tgid = 0;
		cg->ts_computing = 0;
		cg->ts_several = false;
		cg->ts_mps = false;
	}
	list_for_each_entry(client, &qgpu_clients, node)
		if (client->mps_server && client_tsgs(client, NULL))
			client->cg->ts_mps = true;
	list_for_each_entry(client, &qgpu_clients, node) {
		u32 computing = 0;

		cg = client->cg;
		if (cg->ts_several || !client_tsgs(client, &computing))
			continue;
		if (!cg->ts_mps && cg->ts_tgid && cg->ts_tgid != client->tgid) {
			cg->ts_several = true;
			continue;
		}
		cg->ts_tgid = client->tgid;
		cg->ts_computing += computing;
		cg->ts_several = cg->ts_computing > 1;
	}
}

/*
 * An offline timeslice up to this long lets the GPU itself switch to online work about as soon
 * as closing the offline channels would: that takes a FIFO_DISABLE_CHANNELS of 0.6-1.3 ms under
 * GSP (h200-findings.md section 2), and another to open them again.
 */
#define PREEMPTS_MAX_US	1000

/*
 * Which offline cgroups the GPU preempts by itself (cg->ts_preempted): each TSG of theirs on
 * their GPU holds the offline timeslice qgpu set, at most PREEMPTS_MAX_US, and so does the TSG
 * of each channel there. Measured on an H100 and an H200, offline TSGs at 1 us and online ones
 * at 8192 us took an online pod's p50 next to an 8192 trainer from 1.7 to 0.7-0.8 ms with no
 * control per request (BENCHMARKS.md, 2026-11-27). A cgroup of several contexts keeps its own
 * timeslices (count_contexts()), and a channel without a TSG qgpu tracks has none qgpu can set:
 * those the scheduler closes for online work. From what RM carried out (ts_set), after each half
 * of a pass.
 */
static void note_preempted(void)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;
	struct qgpu_cg *cg;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		u32 value = cg->gpu < QGPU_MAX_GPUS ? values[cg->gpu][QGPU_CLASS_OFFLINE] : 0;

		/* ts_tgid: it has TSGs on its GPU (count_contexts(), in this pass's plan()). */
		cg->ts_preempted = gated(cg) && cg->class == QGPU_CLASS_OFFLINE && cg->ts_tgid &&
				   value && value <= PREEMPTS_MAX_US;
	}
	list_for_each_entry(client, &qgpu_clients, node) {
		cg = client->cg;
		if (!cg->ts_preempted)
			continue;
		list_for_each_entry(obj, &client->objects, node) {
			const struct qgpu_obj *tsg = obj;

			if (obj->gpu != (int)cg->gpu)
				continue;
			if (obj->kind == QGPU_OBJ_CHANNEL)
				tsg = qgpu_obj_find(client, obj->parent);
			else if (obj->kind != QGPU_OBJ_TSG)
				continue;
			if (!tsg || tsg->kind != QGPU_OBJ_TSG ||
			    tsg->ts_set != values[cg->gpu][QGPU_CLASS_OFFLINE]) {
				cg->ts_preempted = false;
				break;
			}
		}
	}
}

/* The timeslice qgpu wants on @tsg of a client of @cg; 0: the TSG's own. */
static u64 wanted(const struct qgpu_cg *cg, const struct qgpu_obj *tsg, const bool *online)
{
	if (!gated(cg) || tsg->gpu < 0 || tsg->gpu >= QGPU_MAX_GPUS || cg->gpu != tsg->gpu ||
	    !online[tsg->gpu] || cg->class > QGPU_CLASS_ONLINE || cg->ts_several)
		return 0;
	return values[tsg->gpu][cg->class];
}

/*
 * The compute preemption mode qgpu wants on @tsg, NV2080_CTXSW_PREEMPTION_COMPUTE_* + 1; 0: the
 * context's own. Only an offline TSG that gets its class's timeslice (@want_us, from wanted())
 * and computes, on a GPU whose offline preemption is CTA: the lever the doctor measured (the
 * timeslices with CTA on the trainer's compute channels).
 */
static u8 wanted_mode(const struct qgpu_cg *cg, const struct qgpu_obj *tsg, u64 want_us)
{
	/* want_us set: tsg->gpu is in range (wanted()). */
	if (cg->class != QGPU_CLASS_OFFLINE || !tsg->computes || !want_us ||
	    preemption[tsg->gpu] != QGPU_PREEMPTION_CTA)
		return 0;
	return NV2080_CTXSW_PREEMPTION_COMPUTE_CTA + 1;
}

/*
 * Whether @tsg's compute preemption mode is to change, and where the controls go (*subdevice,
 * *channel). Setting it waits for a compute channel and a subdevice (making either kicks a pass,
 * track.c); a mode to give back with neither left is dropped, as there is no context left to
 * give it to that RM would name.
 */
static bool mode_due(struct qgpu_client *client, struct qgpu_obj *tsg, u8 want, u32 *subdevice,
		     u32 *channel)
{
	lockdep_assert_held(&qgpu_lock);
	if (want ? want == tsg->pm_set : !tsg->pm_set)
		return false;
	if (!want && !tsg->pm_own) {
		tsg->pm_set = 0;	/* nothing known to restore (cannot happen: read first) */
		return false;
	}
	*subdevice = qgpu_client_subdevice(client, tsg->gpu);
	*channel = qgpu_tsg_compute_channel(client, tsg);
	if (!*channel && !want)
		*channel = tsg->handle;	/* as CUDA's own set: it acts too (call 32A) */
	if (*subdevice && *channel)
		return true;
	if (!want)
		tsg->pm_set = 0;
	return false;
}

static void note_retry(unsigned long at, bool *retry, unsigned long *retry_at)
{
	if (!*retry || time_before(at, *retry_at))
		*retry_at = at;
	*retry = true;
}

/*
 * The next changes, at most BATCH of them (*full: more are waiting). A TSG backing off after an
 * error is left for later (*retry, *retry_at: the earliest), unless @now is set.
 */
static unsigned int plan(bool now, bool *full, bool *retry, unsigned long *retry_at)
{
	bool online[QGPU_MAX_GPUS];
	struct qgpu_client *client;
	struct qgpu_obj *obj;
	unsigned int n = 0;

	lockdep_assert_held(&qgpu_lock);
	online_gpus(online);
	count_contexts();
	list_for_each_entry(client, &qgpu_clients, node) {
		list_for_each_entry(obj, &client->objects, node) {
			u32 subdevice = 0, channel = 0;
			bool ts_due, pm_due;
			struct change *c;
			u64 want;
			u8 mode;

			if (obj->kind != QGPU_OBJ_TSG)
				continue;
			want = wanted(client->cg, obj, online);
			ts_due = want ? want != obj->ts_set :
				 obj->ts_set || (obj->ts_owed && !gated(client->cg));
			if (ts_due && !want && !obj->ts_own) {
				/* Nothing known to restore (cannot happen: read before a set). */
				obj->ts_set = 0;
				obj->ts_owed = false;
				ts_due = false;
			}
			mode = wanted_mode(client->cg, obj, want);
			pm_due = mode_due(client, obj, mode, &subdevice, &channel);
			if (!ts_due && !pm_due) {
				obj->ts_failures = 0;	/* nothing to do: no backing off */
				continue;
			}
			if (!now && obj->ts_failures && time_before(jiffies, obj->ts_retry)) {
				note_retry(obj->ts_retry, retry, retry_at);
				continue;
			}
			if (n == BATCH) {
				*full = true;
				return n;
			}
			c = &batch[n++];
			c->client = client->handle;
			c->tsg = obj->handle;
			c->gen = next_gen();
			obj->ts_gen = c->gen;
			obj->pm_gen = c->gen;
			c->ts = ts_due;
			c->value = want ? want : obj->ts_own;
			c->restore = !want;
			c->read_own = want && !obj->ts_own;
			c->own_read = false;
			c->status = NV_ERR_GENERIC;
			c->pm = pm_due;
			c->subdevice = subdevice;
			c->channel = channel;
			c->mode = !pm_due ? 0 : mode ? mode - 1 : obj->pm_own - 1;
			c->pm_restore = !mode;
			c->pm_read_own = mode && !obj->pm_own;
			c->pm_own_read = false;
			c->pm_status = NV_ERR_GENERIC;
		}
	}
	return n;
}

static void apply_timeslice(struct change *c)
{
	if (c->read_own) {
		c->status = qgpu_rmapi_get_timeslice(c->client, c->tsg, &c->own);
		if (c->status != NV_OK)
			return;
		c->own_read = c->own != 0;
		if (!c->own_read) {
			c->status = NV_ERR_INVALID_STATE;
			return;
		}
	}
	c->status = qgpu_rmapi_set_timeslice(c->client, c->tsg, c->value);
}

static void apply_mode(struct change *c)
{
	if (c->pm_read_own) {
		c->pm_status = qgpu_rmapi_get_compute_preemption(c->client, c->subdevice,
								 c->channel, &c->pm_own);
		if (c->pm_status != NV_OK)
			return;
		c->pm_own_read = c->pm_own <= NV2080_CTXSW_PREEMPTION_COMPUTE_CILP;
		if (!c->pm_own_read) {
			c->pm_status = NV_ERR_INVALID_STATE;
			return;
		}
	}
	c->pm_status = qgpu_rmapi_set_compute_preemption(c->client, c->subdevice, c->channel,
							 c->mode);
}

/* Without qgpu_lock: RM sleeps. The mode first, as CUDA sets up a context. */
static void apply(unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		if (batch[i].pm)
			apply_mode(&batch[i]);
		if (batch[i].ts)
			apply_timeslice(&batch[i]);
	}
}

/* The timeslice's part of a change RM answered; false: an error, to back off from. */
static bool record_timeslice(struct qgpu_obj *obj, const struct change *c)
{
	if (c->own_read && !obj->ts_own)
		obj->ts_own = c->own;
	if (c->status != NV_OK) {
		pr_warn_ratelimited("TSG 0x%x of client 0x%x: %s timeslice %llu us: RM status 0x%x, retried\n",
				    c->tsg, c->client, c->restore ? "restoring" : "setting",
				    c->value, c->status);
		return false;
	}
	if (c->restore) {
		obj->ts_set = 0;
		obj->ts_owed = false;
	} else {
		obj->ts_set = c->value;
	}
	return true;
}

/* The mode's part, likewise. */
static bool record_mode(struct qgpu_obj *obj, const struct change *c)
{
	if (c->pm_own_read && !obj->pm_own)
		obj->pm_own = c->pm_own + 1;
	if (c->pm_status != NV_OK) {
		pr_warn_ratelimited("TSG 0x%x of client 0x%x: %s compute preemption %u: RM status 0x%x, retried\n",
				    c->tsg, c->client, c->pm_restore ? "restoring" : "setting",
				    c->mode, c->pm_status);
		return false;
	}
	obj->pm_set = c->pm_restore ? 0 : c->mode + 1;
	return true;
}

/* What RM answered, kept for TSGs still tracked and untouched by their tenant meanwhile. */
static void record(unsigned int n, bool *raced, bool *retry, unsigned long *retry_at)
{
	unsigned int i;

	lockdep_assert_held(&qgpu_lock);
	for (i = 0; i < n; i++) {
		struct change *c = &batch[i];
		struct qgpu_client *client = qgpu_client_find(c->client);
		struct qgpu_obj *obj = client ? qgpu_obj_find(client, c->tsg) : NULL;
		unsigned int shift;
		bool ok;

		if (!obj || obj->kind != QGPU_OBJ_TSG)
			continue;		/* freed meanwhile */
		/*
		 * A setting its tenant asked for meanwhile is planned again; the other is recorded
		 * (a tenant's mode says nothing of the TSG's timeslice, and the reverse).
		 */
		ok = true;
		if (c->ts && obj->ts_gen != c->gen)
			*raced = true;
		else if (c->ts)
			ok = record_timeslice(obj, c);
		if (c->pm && obj->pm_gen != c->gen)
			*raced = true;
		else if (c->pm)
			ok = record_mode(obj, c) && ok;
		if (ok) {
			obj->ts_failures = 0;
			continue;
		}
		if (obj->ts_failures < U8_MAX)
			obj->ts_failures++;
		shift = min_t(unsigned int, obj->ts_failures - 1, RETRY_MAX_SHIFT);
		obj->ts_retry = jiffies + msecs_to_jiffies(RETRY_MS << shift);
		note_retry(obj->ts_retry, retry, retry_at);
	}
}

/* One pass: plan under qgpu_lock, call RM without it, record under it. */
static enum pass_result pass(bool now, unsigned long *retry_at)
{
	bool full = false, raced = false, retry = false;
	unsigned int n;

	if (!qgpu_rmapi_available())
		return PASS_DONE;
	mutex_lock(&qgpu_lock);
	n = plan(now, &full, &retry, retry_at);
	note_preempted();
	mutex_unlock(&qgpu_lock);
	if (!n)
		return retry ? PASS_RETRY : PASS_DONE;
	apply(n);
	mutex_lock(&qgpu_lock);
	record(n, &raced, &retry, retry_at);
	note_preempted();
	mutex_unlock(&qgpu_lock);
	if (full || raced)
		return PASS_MORE;
	return retry ? PASS_RETRY : PASS_DONE;
}

static void ts_work_fn(struct work_struct *work)
{
	unsigned long retry_at = 0;

	switch (pass(false, &retry_at)) {
	case PASS_MORE:
		mod_delayed_work(system_unbound_wq, &ts_work, 0);
		break;
	case PASS_RETRY:
		/* A kick meanwhile has queued it sooner: that stands. */
		queue_delayed_work(system_unbound_wq, &ts_work,
				   time_after(retry_at, jiffies) ? retry_at - jiffies : 1);
		break;
	case PASS_DONE:
		break;
	}
}

/**
 * qgpu_timeslice_kick() - look at every tracked TSG's timeslice again, soon
 *
 * Called after anything that may change what a TSG should have: a TSG tracked, a cgroup
 * configured, changed or unconfigured, a GPU's values changed, a tenant's own request carried
 * out. Any context that may queue work; the pass runs from a workqueue.
 */
void qgpu_timeslice_kick(void)
{
	mod_delayed_work(system_unbound_wq, &ts_work, 0);
}

/**
 * qgpu_timeslice_tsg_dropped() - a TSG of a configured cgroup is gone
 *
 * A process fewer may leave its cgroup one, whose TSGs then get the class's value
 * (count_contexts()). Not once unloading has begun: qgpu_timeslice_exit() has given every TSG
 * its own back, and qgpu_track_exit() drops the TSGs after it; work queued then would run after
 * the module is gone.
 *
 * Context: qgpu_lock held.
 */
void qgpu_timeslice_tsg_dropped(void)
{
	lockdep_assert_held(&qgpu_lock);
	if (!releasing)
		qgpu_timeslice_kick();
}

/**
 * qgpu_timeslice_unsure() - what @cg's TSGs hold may have changed
 * @cg: the cgroup
 *
 * A TSG, channel or compute object made in it, a process moved into or out of it, its
 * configuration or its GPU's values changed, a tenant's timeslice carried out: the GPU is no
 * longer taken to preempt its work by itself (cg->ts_preempted) until a pass has looked again.
 * The caller kicks the pass once its lock is dropped.
 *
 * Context: qgpu_lock held.
 */
void qgpu_timeslice_unsure(struct qgpu_cg *cg)
{
	lockdep_assert_held(&qgpu_lock);
	cg->ts_preempted = false;
}

/**
 * qgpu_timeslice_get() - a class's timeslice on a GPU
 * @gpu: the GPU, < QGPU_MAX_GPUS
 * @class: enum qgpu_class
 *
 * Context: qgpu_lock held.
 * Return: the value in microseconds; 0: TSGs keep their own.
 */
u32 qgpu_timeslice_get(u32 gpu, u8 class)
{
	lockdep_assert_held(&qgpu_lock);
	if (gpu >= QGPU_MAX_GPUS || class > QGPU_CLASS_ONLINE)
		return 0;
	return values[gpu][class];
}

/**
 * qgpu_timeslice_set() - set the classes' timeslices on a GPU
 * @gpu: the GPU
 * @offline_us: the offline TSGs' timeslice, 0 for their own, < 0 unchanged
 * @online_us: the online TSGs' timeslice, likewise
 *
 * Both values are checked before either is set. The caller kicks the pass once its lock is
 * dropped (qgpu_timeslice_kick()).
 *
 * Context: qgpu_lock held.
 * Return: 0, or -EINVAL for a GPU or value out of range.
 */
int qgpu_timeslice_set(u32 gpu, s64 offline_us, s64 online_us)
{
	struct qgpu_cg *cg;

	lockdep_assert_held(&qgpu_lock);
	if (gpu >= QGPU_MAX_GPUS || offline_us > QGPU_TIMESLICE_MAX_US ||
	    online_us > QGPU_TIMESLICE_MAX_US)
		return -EINVAL;
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (cg->gpu == gpu)
			qgpu_timeslice_unsure(cg);
	if (offline_us >= 0)
		values[gpu][QGPU_CLASS_OFFLINE] = offline_us;
	if (online_us >= 0)
		values[gpu][QGPU_CLASS_ONLINE] = online_us;
	return 0;
}

/**
 * qgpu_timeslice_preemption() - a GPU's offline compute preemption
 * @gpu: the GPU, < QGPU_MAX_GPUS
 *
 * Context: qgpu_lock held.
 * Return: enum qgpu_preemption.
 */
u8 qgpu_timeslice_preemption(u32 gpu)
{
	lockdep_assert_held(&qgpu_lock);
	return gpu < QGPU_MAX_GPUS ? preemption[gpu] : QGPU_PREEMPTION_OWN;
}

/**
 * qgpu_timeslice_set_preemption() - set a GPU's offline compute preemption
 * @gpu: the GPU
 * @mode: enum qgpu_preemption
 *
 * The caller kicks the pass once its lock is dropped (qgpu_timeslice_kick()).
 *
 * Context: qgpu_lock held.
 * Return: 0, or -EINVAL for a GPU or mode out of range.
 */
int qgpu_timeslice_set_preemption(u32 gpu, u8 mode)
{
	lockdep_assert_held(&qgpu_lock);
	if (gpu >= QGPU_MAX_GPUS || mode > QGPU_PREEMPTION_CTA)
		return -EINVAL;
	preemption[gpu] = mode;
	return 0;
}

/**
 * qgpu_timeslice_tenant_mode() - RM carried out a tenant's compute preemption mode
 * @file: the file the control came through
 * @hclient: the client the control was sent to
 * @hchannel: the channel or TSG it named
 * @mode: the compute mode it set (NV2080_CTXSW_PREEMPTION_COMPUTE_*)
 *
 * The mode becomes the context's own, the one qgpu restores, and replaced whatever qgpu had set:
 * qgpu sets its own again where it still wants one. A pass that is out for this TSG plans it
 * again. Only a client of @file counts, as for a timeslice.
 *
 * Context: qgpu_lock held.
 * Return: whether the context is a tracked TSG's (the caller then kicks the pass).
 */
bool qgpu_timeslice_tenant_mode(struct file *file, u32 hclient, u32 hchannel, u32 mode)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	client = qgpu_client_find(hclient);
	obj = client && client->file == file ? qgpu_obj_find(client, hchannel) : NULL;
	if (obj && obj->kind == QGPU_OBJ_CHANNEL)
		obj = qgpu_obj_find(client, obj->parent);
	if (!obj || obj->kind != QGPU_OBJ_TSG || mode > NV2080_CTXSW_PREEMPTION_COMPUTE_CILP)
		return false;
	obj->pm_own = mode + 1;
	obj->pm_set = 0;
	obj->pm_gen = next_gen();
	return true;
}

/**
 * qgpu_timeslice_tenant() - a tenant asked RM for a TSG's timeslice
 * @file: the file the control came through
 * @hclient: the client the control was sent to
 * @hobject: the object it was sent to
 * @us: the timeslice asked for, in microseconds
 * @carried_out: RM carried it out (NV_OK); else the tenant guard swallowed it
 *
 * The value becomes the TSG's own, the one qgpu restores. Carried out, it replaced whatever
 * qgpu had set there, so qgpu sets its own again where it still wants one; swallowed, it is owed
 * to the tenant until the TSG is no longer gated. Either way a pass that is out for this TSG
 * plans it again. Only a client of @file counts: RM reaches a client through the file it was
 * made on, and a swallowed request never reached RM, which would have refused another's.
 *
 * Context: qgpu_lock held.
 * Return: whether @hobject is a tracked TSG of @hclient (the caller then kicks the pass, for a
 * request carried out).
 */
bool qgpu_timeslice_tenant(struct file *file, u32 hclient, u32 hobject, u64 us,
			   bool carried_out)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	client = qgpu_client_find(hclient);
	obj = client && client->file == file ? qgpu_obj_find(client, hobject) : NULL;
	if (!obj || obj->kind != QGPU_OBJ_TSG || !us)
		return false;
	obj->ts_own = us;
	obj->ts_owed = !carried_out;
	if (carried_out) {
		obj->ts_set = 0;
		qgpu_timeslice_unsure(client->cg);
	}
	obj->ts_gen = next_gen();
	return true;
}

/**
 * qgpu_timeslice_init() - every GPU at the default timeslices
 */
void qgpu_timeslice_init(void)
{
	int gpu;

	mutex_lock(&qgpu_lock);
	releasing = false;
	for (gpu = 0; gpu < QGPU_MAX_GPUS; gpu++) {
		values[gpu][QGPU_CLASS_OFFLINE] = QGPU_OFFLINE_TIMESLICE_DEFAULT_US;
		values[gpu][QGPU_CLASS_ONLINE] = QGPU_ONLINE_TIMESLICE_DEFAULT_US;
		preemption[gpu] = QGPU_OFFLINE_PREEMPTION_DEFAULT;
	}
	mutex_unlock(&qgpu_lock);
}

/**
 * qgpu_timeslice_exit() - every TSG's own timeslice back, before the RM entry goes
 *
 * Called once nothing can kick the pass any more: the hooks, netlink, sysfs and the schedulers
 * (which drop removed cgroups) are gone. A TSG whose restore RM refuses EXIT_RETRIES times in a
 * row keeps qgpu's value, and the log says so.
 */
void qgpu_timeslice_exit(void)
{
	unsigned long retry_at;
	int retries = 0;

	mutex_lock(&qgpu_lock);
	releasing = true;
	mutex_unlock(&qgpu_lock);
	cancel_delayed_work_sync(&ts_work);
	for (;;) {
		switch (pass(true, &retry_at)) {
		case PASS_MORE:
			continue;
		case PASS_RETRY:
			if (++retries <= EXIT_RETRIES)
				continue;
			pr_warn("unloading: some TSGs keep qgpu's timeslice or preemption mode (RM refused to restore theirs)\n");
			return;
		case PASS_DONE:
			return;
		}
	}
}
