// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: per-cgroup time slices, memory limits and a tenant guard for NVIDIA GPUs, enforced by
 * hooking the driver's ioctl, mmap and release entry points.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/string.h>

#include "qgpu.h"

/* Configuration, tracked objects and statistics (see qgpu.h). */
DEFINE_MUTEX(qgpu_lock);

char *qgpu_target = "nvidia";
module_param_named(target, qgpu_target, charp, 0444);
MODULE_PARM_DESC(target, "The driver to hook: nvidia or nvmock");

static int __init qgpu_init(void)
{
	int err;

	if (strcmp(qgpu_target, "nvidia") && strcmp(qgpu_target, "nvmock")) {
		pr_err("target=%s: not nvidia or nvmock\n", qgpu_target);
		return -EINVAL;
	}
	qgpu_track_init();
	err = qgpu_rmapi_init();
	if (err)
		return err;
	err = qgpu_sched_init();
	if (err)
		goto err_rmapi;
	qgpu_timeslice_init();
	err = qgpu_genl_init();
	if (err)
		goto err_sched;
	err = qgpu_sysfs_init();
	if (err)
		goto err_genl;
	qgpu_rmprobe_init();
	/* Last: tenants are policed only once everything they can reach is in place. */
	err = qgpu_hook_init();
	if (err)
		goto err_rmprobe;
	pr_info("hooked %s\n", qgpu_target);
	return 0;

err_rmprobe:
	qgpu_rmprobe_exit();
	qgpu_sysfs_exit();
err_genl:
	qgpu_genl_exit();
err_sched:
	qgpu_sched_exit();
	qgpu_timeslice_exit();
err_rmapi:
	qgpu_rmapi_exit();
	qgpu_track_exit();
	return err;
}

static void __exit qgpu_exit(void)
{
	qgpu_hook_exit();
	qgpu_rmprobe_exit();
	qgpu_sysfs_exit();
	qgpu_genl_exit();
	/*
	 * Schedulers reopen every channel they closed, and every TSG gets its own timeslice back,
	 * before the RM entry goes. The schedulers first: they drop removed cgroups, which would
	 * look at the timeslices again.
	 */
	qgpu_sched_exit();
	qgpu_timeslice_exit();
	qgpu_rmapi_exit();
	qgpu_track_exit();
}

module_init(qgpu_init);
module_exit(qgpu_exit);

MODULE_LICENSE("GPL");
MODULE_AUTHOR("qpolicy developers");
MODULE_DESCRIPTION("Per-cgroup GPU time slices, memory limits and tenant guard for NVIDIA GPUs");
