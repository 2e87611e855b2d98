// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: ftrace hooks on the target driver's unlocked_ioctl, mmap and release.
 *
 * The handlers are found through the file_operations of an open control device, and the
 * driver's f_op is left alone: RM compares f_op with its own table. Each hook moves the
 * instruction pointer to a wrapper in this module; the wrapper's own call of the handler comes
 * from this module and goes through (the recursion guard), so this file is built without
 * sibling-call optimisation: a tail call would hide the caller and loop.
 *
 * Unloading: a wrapper holds a module reference while it runs, so rmmod is refused while a task
 * is inside the driver through us. Once the module is going, wrappers pass straight through and
 * are counted; exit unregisters the hooks, waits for the count to drain and for RCU-tasks, so no
 * task is left on this module's text.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/ftrace.h>
#include <linux/module.h>
#include <linux/rcupdate.h>
#include <linux/rcupdate_wait.h>
#include <linux/wait.h>

#include "qgpu.h"

static char *devnode = "/dev/nvidiactl";
module_param(devnode, charp, 0444);
MODULE_PARM_DESC(devnode, "A device node of the target driver, to find its file_operations");

static atomic_t inflight = ATOMIC_INIT(0);
static DECLARE_WAIT_QUEUE_HEAD(drained);
static struct module *target_owner;
static bool hooked;

static long (*orig_ioctl)(struct file *file, unsigned int cmd, unsigned long arg);
static int (*orig_mmap)(struct file *file, struct vm_area_struct *vma);
static int (*orig_release)(struct inode *inode, struct file *file);

static void leave(bool counted)
{
	if (counted)
		module_put(THIS_MODULE);
	if (atomic_dec_and_test(&inflight))
		wake_up(&drained);
}

static long hooked_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	bool counted;
	long ret;

	atomic_inc(&inflight);
	counted = try_module_get(THIS_MODULE);
	if (counted)
		ret = qgpu_ioctl(orig_ioctl, file, cmd, arg);
	else
		ret = orig_ioctl(file, cmd, arg);
	leave(counted);
	return ret;
}

static int hooked_mmap(struct file *file, struct vm_area_struct *vma)
{
	bool counted;
	int ret;

	atomic_inc(&inflight);
	counted = try_module_get(THIS_MODULE);
	if (counted)
		ret = qgpu_mmap(orig_mmap, file, vma);
	else
		ret = orig_mmap(file, vma);
	leave(counted);
	return ret;
}

static int hooked_release(struct inode *inode, struct file *file)
{
	bool counted;
	int ret;

	atomic_inc(&inflight);
	counted = try_module_get(THIS_MODULE);
	if (counted)
		ret = qgpu_release(orig_release, inode, file);
	else
		ret = orig_release(inode, file);
	leave(counted);
	return ret;
}

struct qgpu_hook {
	const char *name;
	unsigned long target;
	unsigned long wrapper;
	bool registered;
	struct ftrace_ops ops;
};

static struct qgpu_hook hooks[3] = {
	{ .name = "unlocked_ioctl", .wrapper = (unsigned long)hooked_ioctl },
	{ .name = "mmap", .wrapper = (unsigned long)hooked_mmap },
	{ .name = "release", .wrapper = (unsigned long)hooked_release },
};

static void notrace qgpu_ftrace_thunk(unsigned long ip, unsigned long parent_ip,
				      struct ftrace_ops *ops, struct ftrace_regs *fregs)
{
	struct qgpu_hook *hook = container_of(ops, struct qgpu_hook, ops);

	if (!within_module(parent_ip, THIS_MODULE))
		ftrace_instruction_pointer_set(fregs, hook->wrapper);
}

static int hook_register(struct qgpu_hook *hook)
{
	int err;

	hook->ops.func = qgpu_ftrace_thunk;
	hook->ops.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_RECURSION |
			  FTRACE_OPS_FL_IPMODIFY;
	err = ftrace_set_filter_ip(&hook->ops, hook->target, 0, 0);
	if (err) {
		pr_err("cannot filter %s at %pS: %d\n", hook->name, (void *)hook->target, err);
		return err;
	}
	err = register_ftrace_function(&hook->ops);
	if (err) {
		pr_err("cannot hook %s: %d\n", hook->name, err);
		ftrace_set_filter_ip(&hook->ops, hook->target, 1, 0);
		return err;
	}
	hook->registered = true;
	return 0;
}

static void hook_unregister(struct qgpu_hook *hook)
{
	if (!hook->registered)
		return;
	unregister_ftrace_function(&hook->ops);
	ftrace_set_filter_ip(&hook->ops, hook->target, 1, 0);
	hook->registered = false;
}

/* The target's handlers, from an open device file; a reference on the target module is kept. */
static int find_target(void)
{
	const struct file_operations *fops;
	struct file *file;
	int err = 0;

	file = filp_open(devnode, O_RDONLY, 0);
	if (IS_ERR(file)) {
		pr_err("cannot open %s: %ld\n", devnode, PTR_ERR(file));
		return PTR_ERR(file);
	}
	fops = file->f_op;
	if (!fops || !fops->owner || strcmp(module_name(fops->owner), qgpu_target) ||
	    !fops->unlocked_ioctl || !fops->mmap || !fops->release) {
		pr_err("%s does not belong to %s\n", devnode, qgpu_target);
		err = -ENODEV;
		goto out;
	}
	if (!try_module_get(fops->owner)) {
		err = -ENODEV;
		goto out;
	}
	target_owner = fops->owner;
	orig_ioctl = fops->unlocked_ioctl;
	orig_mmap = fops->mmap;
	orig_release = fops->release;
	hooks[0].target = (unsigned long)orig_ioctl;
	hooks[1].target = (unsigned long)orig_mmap;
	hooks[2].target = (unsigned long)orig_release;
out:
	filp_close(file, NULL);
	return err;
}

static void drain(void)
{
	/* A task moved to a wrapper has counted itself once it passes a voluntary switch. */
	synchronize_rcu_tasks();
	wait_event(drained, atomic_read(&inflight) == 0);
	/* ...and has left the few instructions after its count went down. */
	synchronize_rcu_tasks();
}

int qgpu_hook_init(void)
{
	int err, i;

	err = find_target();
	if (err)
		return err;
	for (i = 0; i < ARRAY_SIZE(hooks); i++) {
		err = hook_register(&hooks[i]);
		if (err)
			goto err_unhook;
	}
	hooked = true;
	return 0;

err_unhook:
	while (--i >= 0)
		hook_unregister(&hooks[i]);
	drain();
	module_put(target_owner);
	return err;
}

void qgpu_hook_exit(void)
{
	int i;

	hooked = false;
	for (i = ARRAY_SIZE(hooks) - 1; i >= 0; i--)
		hook_unregister(&hooks[i]);
	drain();
	module_put(target_owner);
}

bool qgpu_hooked(void)
{
	return READ_ONCE(hooked);
}
