// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: /sys/kernel/qgpu, one value per file (see uapi/qgpu.h). A GPU's policy, period,
 * timeslices and offline preemption may be written by root as well; anything else in a write is
 * refused with -EINVAL.
 */
#include <linux/capability.h>
#include <linux/kobject.h>
#include <linux/kstrtox.h>
#include <linux/module.h>
#include <linux/string.h>
#include <linux/sysfs.h>

#include "qgpu.h"

static const char * const policy_names[] = {
	[QGPU_POLICY_BEST_EFFORT] = "best-effort",
	[QGPU_POLICY_FIXED_SHARE] = "fixed-share",
	[QGPU_POLICY_BURST_SHARE] = "burst-share",
};

static const char * const policy_aliases[] = {
	[QGPU_POLICY_BEST_EFFORT] = "be",
	[QGPU_POLICY_FIXED_SHARE] = "fs",
	[QGPU_POLICY_BURST_SHARE] = "bs",
};

static struct kobject *root;
static struct kobject *gpus[QGPU_MAX_GPUS];

/**
 * qgpu_policy_name() - a policy's name, as sysfs shows it
 * @policy: enum qgpu_policy
 *
 * Return: the name; "?" for an unknown policy.
 */
const char *qgpu_policy_name(u8 policy)
{
	return policy < ARRAY_SIZE(policy_names) ? policy_names[policy] : "?";
}

static ssize_t version_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", QGPU_GENL_VERSION);
}

static ssize_t target_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%s\n", qgpu_target);
}

static ssize_t hooked_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", qgpu_hooked());
}

static ssize_t uvm_hooked_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", qgpu_uvm_hooked());
}

static ssize_t cgroups_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	unsigned int n;

	mutex_lock(&qgpu_lock);
	n = qgpu_nr_configured;
	mutex_unlock(&qgpu_lock);
	return sysfs_emit(buf, "%u\n", n);
}

static ssize_t rm_version_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%s\n", qgpu_rmapi_version());
}

static ssize_t events_sent_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	u64 sent, dropped;

	qgpu_event_counts(&sent, &dropped);
	return sysfs_emit(buf, "%llu\n", sent);
}

static ssize_t events_dropped_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	u64 sent, dropped;

	qgpu_event_counts(&sent, &dropped);
	return sysfs_emit(buf, "%llu\n", dropped);
}

/* Requests refused because the driver's copy differed from qgpu's, and those never checked. */
static ssize_t rewrites_refused_show(struct kobject *kobj, struct kobj_attribute *attr,
				     char *buf)
{
	u64 missed;

	return sysfs_emit(buf, "%llu\n", qgpu_rewrites(&missed));
}

static ssize_t rewrites_unchecked_show(struct kobject *kobj, struct kobj_attribute *attr,
				       char *buf)
{
	u64 missed;

	qgpu_rewrites(&missed);
	return sysfs_emit(buf, "%llu\n", missed);
}

/* Return instances the kretprobe on rm_ioctl could not take (those of checked calls: above). */
static ssize_t answers_missed_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%llu\n", qgpu_rmprobe_answers_missed());
}

static struct kobj_attribute version_attr = __ATTR_RO(version);
static struct kobj_attribute rewrites_refused_attr = __ATTR_RO(rewrites_refused);
static struct kobj_attribute rewrites_unchecked_attr = __ATTR_RO(rewrites_unchecked);
static struct kobj_attribute answers_missed_attr = __ATTR_RO(answers_missed);
static struct kobj_attribute rm_version_attr = __ATTR_RO(rm_version);
static struct kobj_attribute events_sent_attr = __ATTR_RO(events_sent);
static struct kobj_attribute events_dropped_attr = __ATTR_RO(events_dropped);
static struct kobj_attribute target_attr = __ATTR_RO(target);
static struct kobj_attribute hooked_attr = __ATTR_RO(hooked);
static struct kobj_attribute uvm_hooked_attr = __ATTR_RO(uvm_hooked);
static struct kobj_attribute cgroups_attr = __ATTR_RO(cgroups);

static struct attribute *root_attrs[] = {
	&version_attr.attr,
	&target_attr.attr,
	&hooked_attr.attr,
	&uvm_hooked_attr.attr,
	&cgroups_attr.attr,
	&rm_version_attr.attr,
	&events_sent_attr.attr,
	&events_dropped_attr.attr,
	&rewrites_refused_attr.attr,
	&rewrites_unchecked_attr.attr,
	&answers_missed_attr.attr,
	NULL,
};

static const struct attribute_group root_group = { .attrs = root_attrs };

static int gpu_of(struct kobject *kobj)
{
	int i;

	for (i = 0; i < QGPU_MAX_GPUS; i++)
		if (gpus[i] == kobj)
			return i;
	return -1;
}

static int view_of(struct kobject *kobj, struct qgpu_gpu_view *view)
{
	int gpu = gpu_of(kobj);

	if (gpu < 0)
		return -ENODEV;
	mutex_lock(&qgpu_lock);
	qgpu_sched_view(gpu, view);
	mutex_unlock(&qgpu_lock);
	return 0;
}

static ssize_t policy_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	return err ? err : sysfs_emit(buf, "%s\n", qgpu_policy_name(view.policy));
}

static ssize_t set_gpu(struct kobject *kobj, int policy, int period_us, size_t count)
{
	int gpu = gpu_of(kobj);
	int err;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (gpu < 0)
		return -ENODEV;
	if (!qgpu_rmapi_available())
		return -EOPNOTSUPP;
	mutex_lock(&qgpu_lock);
	err = qgpu_sched_set_gpu(gpu, policy, period_us);
	mutex_unlock(&qgpu_lock);
	if (err)
		return err;
	qgpu_sched_kick(gpu);
	return count;
}

static ssize_t policy_store(struct kobject *kobj, struct kobj_attribute *attr, const char *buf,
			    size_t count)
{
	int i;

	for (i = 0; i < ARRAY_SIZE(policy_names); i++)
		if (sysfs_streq(buf, policy_names[i]) || sysfs_streq(buf, policy_aliases[i]))
			return set_gpu(kobj, i, -1, count);
	return -EINVAL;
}

static ssize_t period_us_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	return err ? err : sysfs_emit(buf, "%u\n", view.period_us);
}

static ssize_t period_us_store(struct kobject *kobj, struct kobj_attribute *attr,
			       const char *buf, size_t count)
{
	unsigned int period;

	if (kstrtouint(buf, 10, &period) || period < QGPU_PERIOD_MIN_US ||
	    period > QGPU_PERIOD_MAX_US)
		return -EINVAL;
	return set_gpu(kobj, -1, period, count);
}

static ssize_t nr_periods_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	return err ? err : sysfs_emit(buf, "%llu\n", view.nr_periods);
}

static ssize_t passes_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	return err ? err : sysfs_emit(buf, "%llu\n", view.passes);
}

static ssize_t userd_reads_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	return err ? err : sysfs_emit(buf, "%llu\n", view.userd_reads);
}

static ssize_t online_busy_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	return err ? err : sysfs_emit(buf, "%d\n", view.online_busy);
}

static ssize_t timeslice_show(struct kobject *kobj, char *buf, u8 class)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	return err ? err : sysfs_emit(buf, "%u\n", view.timeslice_us[class]);
}

/*
 * The GPU a write of what qgpu sets through RM (timeslices, preemption) goes to, once its value
 * parsed: root only, and only where qgpu has the driver's RM entry.
 */
static int rm_setting_gpu(struct kobject *kobj)
{
	int gpu = gpu_of(kobj);

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (gpu < 0)
		return -ENODEV;
	if (!qgpu_rmapi_available())
		return -EOPNOTSUPP;
	return gpu;
}

static ssize_t timeslice_store(struct kobject *kobj, const char *buf, size_t count, u8 class)
{
	unsigned int us;
	int gpu, err;

	if (kstrtouint(buf, 10, &us) || us > QGPU_TIMESLICE_MAX_US)
		return -EINVAL;
	gpu = rm_setting_gpu(kobj);
	if (gpu < 0)
		return gpu;
	mutex_lock(&qgpu_lock);
	/* s64: an unsigned us would turn the -1 (unchanged) into 2^32 - 1. */
	err = qgpu_timeslice_set(gpu, class == QGPU_CLASS_OFFLINE ? (s64)us : -1,
				 class == QGPU_CLASS_ONLINE ? (s64)us : -1);
	mutex_unlock(&qgpu_lock);
	if (err)
		return err;
	qgpu_timeslice_kick();
	return count;
}

static ssize_t offline_timeslice_us_show(struct kobject *kobj, struct kobj_attribute *attr,
					 char *buf)
{
	return timeslice_show(kobj, buf, QGPU_CLASS_OFFLINE);
}

static ssize_t offline_timeslice_us_store(struct kobject *kobj, struct kobj_attribute *attr,
					  const char *buf, size_t count)
{
	return timeslice_store(kobj, buf, count, QGPU_CLASS_OFFLINE);
}

static ssize_t online_timeslice_us_show(struct kobject *kobj, struct kobj_attribute *attr,
					char *buf)
{
	return timeslice_show(kobj, buf, QGPU_CLASS_ONLINE);
}

static ssize_t online_timeslice_us_store(struct kobject *kobj, struct kobj_attribute *attr,
					 const char *buf, size_t count)
{
	return timeslice_store(kobj, buf, count, QGPU_CLASS_ONLINE);
}

/* By enum qgpu_preemption. */
static const char * const preemption_names[] = { "own", "cta" };

static ssize_t offline_preemption_show(struct kobject *kobj, struct kobj_attribute *attr,
				       char *buf)
{
	struct qgpu_gpu_view view;
	int err = view_of(kobj, &view);

	if (err)
		return err;
	if (view.offline_preemption >= ARRAY_SIZE(preemption_names))
		return -EINVAL;
	return sysfs_emit(buf, "%s\n", preemption_names[view.offline_preemption]);
}

static ssize_t offline_preemption_store(struct kobject *kobj, struct kobj_attribute *attr,
					const char *buf, size_t count)
{
	int gpu, mode, err;

	mode = sysfs_match_string(preemption_names, buf);
	if (mode < 0)
		return -EINVAL;
	gpu = rm_setting_gpu(kobj);
	if (gpu < 0)
		return gpu;
	mutex_lock(&qgpu_lock);
	err = qgpu_timeslice_set_preemption(gpu, mode);
	mutex_unlock(&qgpu_lock);
	if (err)
		return err;
	qgpu_timeslice_kick();
	return count;
}

static struct kobj_attribute policy_attr = __ATTR_RW(policy);
static struct kobj_attribute period_us_attr = __ATTR_RW(period_us);
static struct kobj_attribute nr_periods_attr = __ATTR_RO(nr_periods);
static struct kobj_attribute passes_attr = __ATTR_RO(passes);
static struct kobj_attribute userd_reads_attr = __ATTR_RO(userd_reads);
static struct kobj_attribute online_busy_attr = __ATTR_RO(online_busy);
static struct kobj_attribute offline_timeslice_us_attr = __ATTR_RW(offline_timeslice_us);
static struct kobj_attribute online_timeslice_us_attr = __ATTR_RW(online_timeslice_us);
static struct kobj_attribute offline_preemption_attr = __ATTR_RW(offline_preemption);

static struct attribute *gpu_attrs[] = {
	&policy_attr.attr,
	&period_us_attr.attr,
	&nr_periods_attr.attr,
	&passes_attr.attr,
	&userd_reads_attr.attr,
	&online_busy_attr.attr,
	&offline_timeslice_us_attr.attr,
	&online_timeslice_us_attr.attr,
	&offline_preemption_attr.attr,
	NULL,
};

static const struct attribute_group gpu_group = { .attrs = gpu_attrs };

/**
 * qgpu_sysfs_init() - create /sys/kernel/qgpu
 *
 * Context: module init.
 * Return: 0, or -ENOMEM or a sysfs error (nothing is left behind).
 */
int qgpu_sysfs_init(void)
{
	char name[8];
	int i, err;

	root = kobject_create_and_add("qgpu", kernel_kobj);
	if (!root)
		return -ENOMEM;
	err = sysfs_create_group(root, &root_group);
	if (err)
		goto err_put;
	for (i = 0; i < QGPU_MAX_GPUS; i++) {
		snprintf(name, sizeof(name), "gpu%d", i);
		gpus[i] = kobject_create_and_add(name, root);
		if (!gpus[i]) {
			err = -ENOMEM;
			goto err_gpus;
		}
		err = sysfs_create_group(gpus[i], &gpu_group);
		if (err)
			goto err_gpus;
	}
	return 0;

err_gpus:
	for (i = 0; i < QGPU_MAX_GPUS; i++) {
		kobject_put(gpus[i]);
		gpus[i] = NULL;
	}
err_put:
	kobject_put(root);
	root = NULL;
	return err;
}

/**
 * qgpu_sysfs_exit() - remove /sys/kernel/qgpu
 *
 * Context: module exit, or init unwinding.
 */
void qgpu_sysfs_exit(void)
{
	int i;

	for (i = 0; i < QGPU_MAX_GPUS; i++) {
		kobject_put(gpus[i]);
		gpus[i] = NULL;
	}
	kobject_put(root);
	root = NULL;
}
