// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the generic netlink family "qgpu" (see uapi/qgpu.h).
 *
 * Every command needs CAP_NET_ADMIN in the initial user namespace (GENL_ADMIN_PERM): root in a
 * container's user namespace gets -EPERM. Attributes are validated strictly by the policy
 * before a handler runs, and a handler checks everything before it changes anything, so a
 * refused message leaves the state as it was.
 *
 * Configuring or unconfiguring a cgroup changes which cgroup governs the ones below it: the
 * tracker charges every client again (qgpu_cg_config_changed() in track.c) and every GPU's
 * scheduler is woken.
 *
 * Removed cgroups: a delayed work looks up every configured cgroup's id every REAP_MS while
 * any is configured (whether or not a scheduler runs) and drops the configuration of those
 * that are gone, with a CGROUP_GONE event each.
 *
 * Events go to the "events" multicast group only while it has a listener
 * (genl_has_listeners). OOM and DENIED events together are limited to
 * QGPU_EVENT_RATE_PER_SEC a second (a window of one second from the first of them); those
 * past it are dropped and counted (/sys/kernel/qgpu/events_dropped). CGROUP_GONE is not
 * limited: there is at most one per configured cgroup.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cgroup.h>
#include <linux/jiffies.h>
#include <linux/lockdep.h>
#include <linux/rwsem.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <net/genetlink.h>

#include "qgpu.h"

static struct netlink_range_validation period_range = {
	.min = QGPU_PERIOD_MIN_US,
	.max = QGPU_PERIOD_MAX_US,
};

/* Past an s16: NLA_POLICY_MAX cannot carry it. */
static struct netlink_range_validation timeslice_range = {
	.min = 0,
	.max = QGPU_TIMESLICE_MAX_US,
};

static const struct nla_policy qgpu_policy[QGPU_A_MAX + 1] = {
	[QGPU_A_GPU] = NLA_POLICY_MAX(NLA_U32, QGPU_MAX_GPUS - 1),
	[QGPU_A_POLICY] = NLA_POLICY_MAX(NLA_U8, QGPU_POLICY_BURST_SHARE),
	[QGPU_A_PERIOD_US] = NLA_POLICY_FULL_RANGE(NLA_U32, &period_range),
	[QGPU_A_CGROUP_ID] = { .type = NLA_U64 },
	[QGPU_A_CLASS] = NLA_POLICY_MAX(NLA_U8, QGPU_CLASS_ONLINE),
	[QGPU_A_SHARE] = NLA_POLICY_RANGE(NLA_U32, 1, QGPU_SHARE_MAX),
	[QGPU_A_MEM_LIMIT] = { .type = NLA_U64 },
	[QGPU_A_PAD] = { .type = NLA_REJECT },
	[QGPU_A_MEM_USED ... QGPU_A_SWITCHES] = { .type = NLA_REJECT },
	[QGPU_A_OFFLINE_TIMESLICE_US] = NLA_POLICY_FULL_RANGE(NLA_U32, &timeslice_range),
	[QGPU_A_ONLINE_TIMESLICE_US] = NLA_POLICY_FULL_RANGE(NLA_U32, &timeslice_range),
	[QGPU_A_OWN_TIMESLICES ... QGPU_A_TIMESLICE_PREEMPTED] = { .type = NLA_REJECT },
	[QGPU_A_OFFLINE_PREEMPTION] = NLA_POLICY_MAX(NLA_U8, QGPU_PREEMPTION_CTA),
};

#define REAP_MS 100

static struct genl_family qgpu_family;
static DECLARE_RWSEM(event_sem);
static bool registered;

static DEFINE_SPINLOCK(rate_lock);
static unsigned long rate_window;	/* jiffies: the current window began */
static u32 rate_count;			/* events sent in it */
static u64 events_sent;
static u64 events_dropped;

static void reap_work_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(reap_work, reap_work_fn);

static int need(struct genl_info *info, int attr)
{
	if (info->attrs[attr])
		return 0;
	NL_SET_ERR_MSG_MOD(info->extack, "a required attribute is missing");
	return -EINVAL;
}

static int gpu_set(struct sk_buff *skb, struct genl_info *info)
{
	struct nlattr **a = info->attrs;
	int policy = -1, period = -1;
	s64 offline_us = -1, online_us = -1;
	int preemption = -1;
	u32 gpu;
	int err;

	err = need(info, QGPU_A_GPU);
	if (err)
		return err;
	if (!a[QGPU_A_POLICY] && !a[QGPU_A_PERIOD_US] && !a[QGPU_A_OFFLINE_TIMESLICE_US] &&
	    !a[QGPU_A_ONLINE_TIMESLICE_US] && !a[QGPU_A_OFFLINE_PREEMPTION]) {
		NL_SET_ERR_MSG_MOD(info->extack,
				   "nothing to set: give a policy, a period, timeslices or a preemption");
		return -EINVAL;
	}
	if (!qgpu_rmapi_available()) {
		NL_SET_ERR_MSG_MOD(info->extack, "the target driver offers no in-kernel RM entry");
		return -EOPNOTSUPP;
	}
	gpu = nla_get_u32(a[QGPU_A_GPU]);
	if (a[QGPU_A_POLICY])
		policy = nla_get_u8(a[QGPU_A_POLICY]);
	if (a[QGPU_A_PERIOD_US])
		period = nla_get_u32(a[QGPU_A_PERIOD_US]);
	if (a[QGPU_A_OFFLINE_TIMESLICE_US])
		offline_us = nla_get_u32(a[QGPU_A_OFFLINE_TIMESLICE_US]);
	if (a[QGPU_A_ONLINE_TIMESLICE_US])
		online_us = nla_get_u32(a[QGPU_A_ONLINE_TIMESLICE_US]);
	if (a[QGPU_A_OFFLINE_PREEMPTION])
		preemption = nla_get_u8(a[QGPU_A_OFFLINE_PREEMPTION]);
	mutex_lock(&qgpu_lock);
	/* The policy alone can be refused here; the timeslices were checked by the policy. */
	if (policy >= 0 || period >= 0)
		err = qgpu_sched_set_gpu(gpu, policy, period);
	if (!err)
		err = qgpu_timeslice_set(gpu, offline_us, online_us);
	/* In range (the policy checked it): cannot fail once the rest is set. */
	if (!err && preemption >= 0)
		err = qgpu_timeslice_set_preemption(gpu, preemption);
	mutex_unlock(&qgpu_lock);
	if (err) {
		NL_SET_ERR_MSG_MOD(info->extack,
				   "fixed-share shares on this GPU sum to more than 100");
		return err;
	}
	qgpu_sched_kick(gpu);
	if (offline_us >= 0 || online_us >= 0 || preemption >= 0)
		qgpu_timeslice_kick();
	return 0;
}

static int cgroup_exists(u64 id)
{
	struct cgroup *cgrp = cgroup_get_from_id(id);

	if (IS_ERR_OR_NULL(cgrp))
		return -ENOENT;
	cgroup_put(cgrp);
	return 0;
}

static int cgroup_set(struct sk_buff *skb, struct genl_info *info)
{
	struct nlattr **a = info->attrs;
	struct qgpu_gpu_view view;
	struct qgpu_cg *cg;
	u32 gpu, share, old_gpu = QGPU_MAX_GPUS;	/* QGPU_MAX_GPUS: newly configured */
	u64 id, limit = 0;
	u8 class;
	int err;

	err = need(info, QGPU_A_CGROUP_ID) ?: need(info, QGPU_A_GPU) ?:
	      need(info, QGPU_A_CLASS) ?: need(info, QGPU_A_SHARE);
	if (err)
		return err;
	id = nla_get_u64(a[QGPU_A_CGROUP_ID]);
	gpu = nla_get_u32(a[QGPU_A_GPU]);
	class = nla_get_u8(a[QGPU_A_CLASS]);
	share = nla_get_u32(a[QGPU_A_SHARE]);
	if (a[QGPU_A_MEM_LIMIT])
		limit = nla_get_u64(a[QGPU_A_MEM_LIMIT]);
	if (cgroup_exists(id)) {
		NL_SET_ERR_MSG_ATTR(info->extack, a[QGPU_A_CGROUP_ID], "no cgroup v2 with this id");
		return -ENOENT;
	}

	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(id, false);
	if ((!cg || !cg->configured) && qgpu_nr_configured >= QGPU_MAX_CGROUPS) {
		NL_SET_ERR_MSG_MOD(info->extack, "too many configured cgroups");
		err = -ENOSPC;
		goto out;
	}
	qgpu_sched_view(gpu, &view);
	if (qgpu_sched_check_shares(gpu, view.policy, id, share)) {
		NL_SET_ERR_MSG_ATTR(info->extack, a[QGPU_A_SHARE],
				    "fixed-share shares on this GPU would sum to more than 100");
		err = -EINVAL;
		goto out;
	}
	cg = qgpu_cg_get(id, true);
	if (!cg) {
		err = -ENOMEM;
		goto out;
	}
	if (cg->configured) {
		old_gpu = cg->gpu;
	} else {
		cg->configured = true;
		qgpu_nr_configured++;
	}
	cg->gpu = gpu;
	cg->class = class;
	cg->share = share;
	qgpu_timeslice_unsure(cg);
	cg->mem_limit = limit;
	if (old_gpu == QGPU_MAX_GPUS)
		qgpu_cg_config_changed();	/* it now governs the cgroups below it */
out:
	mutex_unlock(&qgpu_lock);
	if (err)
		return err;
	qgpu_sched_kick_all();
	qgpu_timeslice_kick();
	mod_delayed_work(system_wq, &reap_work, msecs_to_jiffies(REAP_MS));
	return 0;
}

/*
 * Under qgpu_lock: the cgroup goes back to ungated; what it holds stays tracked, charged to
 * whichever cgroup governs it now. @cg may be freed. The caller kicks the schedulers and the
 * timeslices once the lock is dropped.
 */
static u32 unconfigure(struct qgpu_cg *cg)
{
	u32 gpu = cg->gpu;

	lockdep_assert_held(&qgpu_lock);
	cg->configured = false;
	cg->mem_limit = 0;
	cg->open = true;
	qgpu_nr_configured--;
	qgpu_cg_config_changed();
	return gpu;
}

static int cgroup_del(struct sk_buff *skb, struct genl_info *info)
{
	struct qgpu_cg *cg;
	int err;

	err = need(info, QGPU_A_CGROUP_ID);
	if (err)
		return err;
	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(nla_get_u64(info->attrs[QGPU_A_CGROUP_ID]), false);
	if (cg && cg->configured)
		unconfigure(cg);
	else
		err = -ENOENT;
	mutex_unlock(&qgpu_lock);
	if (err) {
		NL_SET_ERR_MSG_ATTR(info->extack, info->attrs[QGPU_A_CGROUP_ID],
				    "cgroup not configured");
		return err;
	}
	qgpu_sched_kick_all();
	qgpu_timeslice_kick();
	return 0;
}

/**
 * qgpu_reap_cgroups() - drop the configuration of every configured cgroup that was removed
 *
 * Each is reported with a CGROUP_GONE event. The ids are looked up without qgpu_lock.
 *
 * Context: process context; qgpu_lock not held.
 */
void qgpu_reap_cgroups(void)
{
	unsigned int n = 0, i, cap;
	struct qgpu_cg *cg;
	u32 *gpus;
	u64 *ids;

	mutex_lock(&qgpu_lock);
	cap = qgpu_nr_configured;
	mutex_unlock(&qgpu_lock);
	if (!cap)
		return;
	ids = kcalloc(cap, sizeof(*ids), GFP_KERNEL);
	gpus = kcalloc(cap, sizeof(*gpus), GFP_KERNEL);
	if (!ids || !gpus)
		goto out;
	mutex_lock(&qgpu_lock);
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (cg->configured && n < cap)
			ids[n++] = cg->id;
	mutex_unlock(&qgpu_lock);
	/* Keep only the removed ones. */
	for (i = 0, cap = 0; i < n; i++)
		if (cgroup_exists(ids[i]))
			ids[cap++] = ids[i];
	n = cap;
	if (!n)
		goto out;
	mutex_lock(&qgpu_lock);
	for (i = 0; i < n; i++) {
		cg = qgpu_cg_get(ids[i], false);
		if (cg && cg->configured)
			gpus[i] = unconfigure(cg);
		else
			ids[i] = 0;	/* deleted meanwhile */
	}
	mutex_unlock(&qgpu_lock);
	qgpu_sched_kick_all();
	qgpu_timeslice_kick();
	for (i = 0; i < n; i++)
		if (ids[i])
			qgpu_event(QGPU_EVENT_CGROUP_GONE, ids[i], gpus[i]);
out:
	kfree(ids);
	kfree(gpus);
}

static void reap_work_fn(struct work_struct *work)
{
	unsigned int configured;

	qgpu_reap_cgroups();
	mutex_lock(&qgpu_lock);
	configured = qgpu_nr_configured;
	mutex_unlock(&qgpu_lock);
	if (configured)
		queue_delayed_work(system_wq, &reap_work, msecs_to_jiffies(REAP_MS));
}

static int put_cg(struct sk_buff *skb, const struct qgpu_cg *cg)
{
	if (nla_put_u64_64bit(skb, QGPU_A_CGROUP_ID, cg->id, QGPU_A_PAD) ||
	    nla_put_u32(skb, QGPU_A_GPU, cg->gpu) ||
	    nla_put_u8(skb, QGPU_A_CLASS, cg->class) ||
	    nla_put_u32(skb, QGPU_A_SHARE, cg->share) ||
	    nla_put_u64_64bit(skb, QGPU_A_MEM_LIMIT, cg->mem_limit, QGPU_A_PAD) ||
	    nla_put_u64_64bit(skb, QGPU_A_MEM_USED, cg->mem_used, QGPU_A_PAD) ||
	    nla_put_u64_64bit(skb, QGPU_A_NR_PERIODS, cg->nr_periods, QGPU_A_PAD) ||
	    nla_put_u64_64bit(skb, QGPU_A_NR_THROTTLED, cg->nr_throttled, QGPU_A_PAD) ||
	    nla_put_u64_64bit(skb, QGPU_A_THROTTLED_NS, cg->throttled_ns, QGPU_A_PAD) ||
	    nla_put_u64_64bit(skb, QGPU_A_OPEN_NS, cg->open_ns, QGPU_A_PAD) ||
	    nla_put_u32(skb, QGPU_A_CLIENTS, cg->clients) ||
	    nla_put_u32(skb, QGPU_A_TSGS, cg->tsgs) ||
	    nla_put_u32(skb, QGPU_A_CHANNELS, cg->channels) ||
	    nla_put_u64_64bit(skb, QGPU_A_OOM, cg->oom, QGPU_A_PAD) ||
	    nla_put_u64_64bit(skb, QGPU_A_DENIED, cg->denied, QGPU_A_PAD) ||
	    nla_put_u8(skb, QGPU_A_BUSY, cg->busy) ||
	    nla_put_u8(skb, QGPU_A_OWN_TIMESLICES, cg->ts_several) ||
	    nla_put_u8(skb, QGPU_A_TIMESLICE_PREEMPTED, cg->ts_preempted))
		return -EMSGSIZE;
	return 0;
}

static int cgroup_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	long skip = cb->args[0], index = 0;
	struct qgpu_cg *cg;
	void *hdr;

	mutex_lock(&qgpu_lock);
	list_for_each_entry(cg, &qgpu_cgroups, node) {
		if (!cg->configured)
			continue;
		if (index++ < skip)
			continue;
		hdr = genlmsg_put(skb, NETLINK_CB(cb->skb).portid, cb->nlh->nlmsg_seq,
				  &qgpu_family, NLM_F_MULTI, QGPU_CMD_CGROUP_GET);
		if (!hdr)
			break;
		if (put_cg(skb, cg)) {
			genlmsg_cancel(skb, hdr);
			break;
		}
		genlmsg_end(skb, hdr);
		cb->args[0] = index;
	}
	mutex_unlock(&qgpu_lock);
	return skb->len;
}

static int gpu_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	struct qgpu_gpu_view view;
	long gpu;
	void *hdr;

	for (gpu = cb->args[0]; gpu < QGPU_MAX_GPUS; gpu++) {
		mutex_lock(&qgpu_lock);
		qgpu_sched_view(gpu, &view);
		mutex_unlock(&qgpu_lock);
		hdr = genlmsg_put(skb, NETLINK_CB(cb->skb).portid, cb->nlh->nlmsg_seq,
				  &qgpu_family, NLM_F_MULTI, QGPU_CMD_GPU_GET);
		if (!hdr)
			break;
		if (nla_put_u32(skb, QGPU_A_GPU, gpu) ||
		    nla_put_u8(skb, QGPU_A_POLICY, view.policy) ||
		    nla_put_u32(skb, QGPU_A_PERIOD_US, view.period_us) ||
		    nla_put_u64_64bit(skb, QGPU_A_NR_PERIODS, view.nr_periods, QGPU_A_PAD) ||
		    nla_put_u64_64bit(skb, QGPU_A_SWITCHES, view.switches, QGPU_A_PAD) ||
		    nla_put_u8(skb, QGPU_A_ONLINE_BUSY, view.online_busy) ||
		    nla_put_u32(skb, QGPU_A_OFFLINE_TIMESLICE_US,
				view.timeslice_us[QGPU_CLASS_OFFLINE]) ||
		    nla_put_u32(skb, QGPU_A_ONLINE_TIMESLICE_US,
				view.timeslice_us[QGPU_CLASS_ONLINE]) ||
		    nla_put_u8(skb, QGPU_A_OFFLINE_PREEMPTION, view.offline_preemption)) {
			genlmsg_cancel(skb, hdr);
			break;
		}
		genlmsg_end(skb, hdr);
	}
	cb->args[0] = gpu;
	return skb->len;
}

static const struct genl_ops qgpu_ops[] = {
	{ .cmd = QGPU_CMD_GPU_SET, .doit = gpu_set, .flags = GENL_ADMIN_PERM },
	{ .cmd = QGPU_CMD_GPU_GET, .dumpit = gpu_dump, .flags = GENL_ADMIN_PERM },
	{ .cmd = QGPU_CMD_CGROUP_SET, .doit = cgroup_set, .flags = GENL_ADMIN_PERM },
	{ .cmd = QGPU_CMD_CGROUP_DEL, .doit = cgroup_del, .flags = GENL_ADMIN_PERM },
	{ .cmd = QGPU_CMD_CGROUP_GET, .dumpit = cgroup_dump, .flags = GENL_ADMIN_PERM },
};

static const struct genl_multicast_group qgpu_mcgrps[] = {
	{ .name = QGPU_MCGRP_EVENTS, .flags = GENL_ADMIN_PERM },
};

static struct genl_family qgpu_family __ro_after_init = {
	.name = QGPU_GENL_NAME,
	.version = QGPU_GENL_VERSION,
	.maxattr = QGPU_A_MAX,
	.policy = qgpu_policy,
	.netnsok = false,
	.module = THIS_MODULE,
	.ops = qgpu_ops,
	.n_ops = ARRAY_SIZE(qgpu_ops),
	.resv_start_op = QGPU_CMD_GPU_SET,
	.mcgrps = qgpu_mcgrps,
	.n_mcgrps = ARRAY_SIZE(qgpu_mcgrps),
};

/* Whether an event may go now: OOM and DENIED share a budget per one-second window. */
static bool event_allowed(u8 event)
{
	bool ok = true;

	spin_lock(&rate_lock);
	if (event != QGPU_EVENT_CGROUP_GONE) {
		if (!rate_count || time_after_eq(jiffies, rate_window + HZ)) {
			rate_window = jiffies;
			rate_count = 0;
		}
		ok = rate_count < QGPU_EVENT_RATE_PER_SEC;
		if (ok)
			rate_count++;
	}
	if (ok)
		events_sent++;
	else
		events_dropped++;
	spin_unlock(&rate_lock);
	return ok;
}

/**
 * qgpu_event() - multicast an event to the "events" group
 * @event: enum qgpu_event
 * @cgroup_id: the cgroup it is about
 * @gpu: the GPU it is about (0 where none)
 *
 * Nothing is built without a listener; past the rate limit it is dropped and counted (see the
 * header of this file).
 *
 * Context: process context; qgpu_lock not held (it allocates with GFP_KERNEL).
 */
void qgpu_event(u8 event, u64 cgroup_id, u32 gpu)
{
	struct sk_buff *skb;
	void *hdr;

	down_read(&event_sem);
	if (!registered || !genl_has_listeners(&qgpu_family, &init_net, 0) ||
	    !event_allowed(event))
		goto out;
	skb = genlmsg_new(nla_total_size(sizeof(u8)) + nla_total_size_64bit(sizeof(u64)) +
			  nla_total_size(sizeof(u32)), GFP_KERNEL);
	if (!skb)
		goto out;
	hdr = genlmsg_put(skb, 0, 0, &qgpu_family, 0, QGPU_CMD_EVENT);
	if (!hdr || nla_put_u8(skb, QGPU_A_EVENT, event) ||
	    nla_put_u64_64bit(skb, QGPU_A_CGROUP_ID, cgroup_id, QGPU_A_PAD) ||
	    nla_put_u32(skb, QGPU_A_GPU, gpu)) {
		nlmsg_free(skb);
		goto out;
	}
	genlmsg_end(skb, hdr);
	genlmsg_multicast(&qgpu_family, skb, 0, 0, GFP_KERNEL);
out:
	up_read(&event_sem);
}

/**
 * qgpu_event_counts() - events sent to listeners, and dropped past the rate limit
 * @sent: set to the events multicast since load
 * @dropped: set to the events dropped by the rate limit since load
 *
 * Context: any.
 */
void qgpu_event_counts(u64 *sent, u64 *dropped)
{
	spin_lock(&rate_lock);
	*sent = events_sent;
	*dropped = events_dropped;
	spin_unlock(&rate_lock);
}

/**
 * qgpu_genl_init() - register the "qgpu" generic netlink family
 *
 * Context: module init.
 * Return: 0 or genl_register_family()'s error.
 */
int qgpu_genl_init(void)
{
	int err = genl_register_family(&qgpu_family);

	if (err)
		return err;
	down_write(&event_sem);
	registered = true;
	up_write(&event_sem);
	return 0;
}

/**
 * qgpu_genl_exit() - unregister the family and stop reaping
 *
 * Context: module exit; qgpu_lock not held.
 */
void qgpu_genl_exit(void)
{
	down_write(&event_sem);
	registered = false;
	up_write(&event_sem);
	genl_unregister_family(&qgpu_family);
	/* No command can re-arm it now; the work re-arms itself, which this cancels too. */
	cancel_delayed_work_sync(&reap_work);
}
