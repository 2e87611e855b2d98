// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: ftrace hooks on the target driver's unlocked_ioctl, mmap and release, and on
 * nvidia-uvm's mmap where that driver is loaded (managed memory: uvm.c).
 *
 * The handlers are found through the file_operations of an open control device, and the
 * driver's f_op is left alone: RM compares f_op with its own table. Each hook moves the
 * instruction pointer to a wrapper in this module; the wrapper's own call of the handler comes
 * from this module and goes through (the recursion guard), so this file is built without
 * sibling-call optimisation: a tail call would hide the caller and loop.
 *
 * Unloading: the hook takes a module reference before it sends a call to a wrapper, and the
 * wrapper puts it back when the handler returns, so rmmod is refused while a task is inside the
 * driver through us. Once the module is going, the hook takes no reference and the call goes
 * straight to the handler, without touching a wrapper.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/ftrace.h>
#include <linux/module.h>

#include "qgpu.h"

static char *devnode = "/dev/nvidiactl";
module_param(devnode, charp, 0444);
MODULE_PARM_DESC(devnode, "A device node of the target driver, to find its file_operations");

static char *uvm_devnode = "/dev/nvidia-uvm";
module_param(uvm_devnode, charp, 0444);
MODULE_PARM_DESC(uvm_devnode, "nvidia-uvm's device node, to find its mmap (managed memory)");

static struct module *target_owner;
static struct module *uvm_owner;	/* NULL: nvidia-uvm not hooked */
static bool hooked;

static long (*orig_ioctl)(struct file *file, unsigned int cmd, unsigned long arg);
static int (*orig_mmap)(struct file *file, struct vm_area_struct *vma);
static int (*orig_release)(struct inode *inode, struct file *file);
static int (*orig_uvm_mmap)(struct file *file, struct vm_area_struct *vma);

/* Each wrapper runs with the module reference its hook took, and puts it back last. */
static long hooked_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	long ret = qgpu_ioctl(orig_ioctl, file, cmd, arg);

	module_put(THIS_MODULE);
	return ret;
}

static int hooked_mmap(struct file *file, struct vm_area_struct *vma)
{
	int ret = qgpu_mmap(orig_mmap, file, vma);

	module_put(THIS_MODULE);
	return ret;
}

static int hooked_release(struct inode *inode, struct file *file)
{
	int ret = qgpu_release(orig_release, inode, file);

	module_put(THIS_MODULE);
	return ret;
}

static int hooked_uvm_mmap(struct file *file, struct vm_area_struct *vma)
{
	int ret = qgpu_uvm_mmap(orig_uvm_mmap, file, vma);

	module_put(THIS_MODULE);
	return ret;
}

struct qgpu_hook {
	unsigned long target;		/* 0: not hooked (nvidia-uvm absent) */
	unsigned long wrapper;
};

static struct qgpu_hook hooks[4] = {
	{ .wrapper = (unsigned long)hooked_ioctl },
	{ .wrapper = (unsigned long)hooked_mmap },
	{ .wrapper = (unsigned long)hooked_release },
	{ .wrapper = (unsigned long)hooked_uvm_mmap },
};

/*
 * One ftrace_ops for all the handlers: unregistering an ops waits for RCU-tasks grace
 * periods, so one ops instead of three makes rmmod that much shorter.
 */
static struct ftrace_ops hook_ops;

/*
 * ftrace reports the address of the handler's fentry call, which follows an ENDBR where the
 * kernel has IBT; the handlers are far longer than that gap, so the nearest start is the one.
 */
#define FENTRY_MAX_OFFSET 16

static void notrace qgpu_ftrace_thunk(unsigned long ip, unsigned long parent_ip,
				      struct ftrace_ops *ops, struct ftrace_regs *fregs)
{
	int i;

	if (within_module(parent_ip, THIS_MODULE))
		return;
	for (i = 0; i < ARRAY_SIZE(hooks); i++) {
		if (hooks[i].target && ip - hooks[i].target < FENTRY_MAX_OFFSET) {
			if (try_module_get(THIS_MODULE))
				ftrace_instruction_pointer_set(fregs, hooks[i].wrapper);
			return;
		}
	}
}

static void hook_unfilter(int count)
{
	while (--count >= 0)
		if (hooks[count].target)
			ftrace_set_filter_ip(&hook_ops, hooks[count].target, 1, 0);
}

static int hook_register(void)
{
	int err, i;

	hook_ops.func = qgpu_ftrace_thunk;
	/*
	 * PERMANENT: with kernel.ftrace_enabled switched off the hooks would stop, and with them
	 * the memory gate and the tenant guard; the kernel refuses that switch while we are hooked.
	 */
	hook_ops.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_RECURSION |
			 FTRACE_OPS_FL_IPMODIFY | FTRACE_OPS_FL_PERMANENT;
	for (i = 0; i < ARRAY_SIZE(hooks); i++) {
		if (!hooks[i].target)
			continue;
		err = ftrace_set_filter_ip(&hook_ops, hooks[i].target, 0, 0);
		if (err) {
			pr_err("cannot filter %pS: %d\n", (void *)hooks[i].target, err);
			goto err_unfilter;
		}
	}
	err = register_ftrace_function(&hook_ops);
	if (err) {
		pr_err("cannot hook %s: %d\n", qgpu_target, err);
		goto err_unfilter;
	}
	return 0;

err_unfilter:
	hook_unfilter(i);
	return err;
}

static void hook_unregister(void)
{
	unregister_ftrace_function(&hook_ops);
	hook_unfilter(ARRAY_SIZE(hooks));
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

/*
 * nvidia-uvm's mmap, from an open /dev/nvidia-uvm; a reference on its module is kept. Where
 * there is none (the driver not loaded, no node), qgpu runs without it and says so once, in the
 * log and in /sys/kernel/qgpu/uvm_hooked: managed memory is then not refused (see uvm.c).
 */
static void find_uvm(void)
{
	const char *owner = strcmp(qgpu_target, "nvidia") ? qgpu_target : "nvidia_uvm";
	const struct file_operations *fops;
	struct file *file;

	file = filp_open(uvm_devnode, O_RDWR, 0);
	if (IS_ERR(file)) {
		pr_info("cannot open %s (%ld): managed memory is not refused to limited cgroups\n",
			uvm_devnode, PTR_ERR(file));
		return;
	}
	fops = file->f_op;
	if (fops && fops->owner && !strcmp(module_name(fops->owner), owner) && fops->mmap &&
	    try_module_get(fops->owner)) {
		uvm_owner = fops->owner;
		orig_uvm_mmap = fops->mmap;
		hooks[3].target = (unsigned long)orig_uvm_mmap;
	} else {
		pr_info("%s does not belong to %s: managed memory is not refused to limited cgroups\n",
			uvm_devnode, owner);
	}
	filp_close(file, NULL);
}

/**
 * qgpu_hook_init() - find the target driver's file operations and hook them
 *
 * Holds a reference on the target driver's module while hooked.
 *
 * Context: module init, last: everything the hooks reach is in place.
 * Return: 0, or the error of finding the driver or registering the hooks.
 */
int qgpu_hook_init(void)
{
	int err;

	err = find_target();
	if (err)
		return err;
	find_uvm();
	err = hook_register();
	if (err) {
		if (uvm_owner)
			module_put(uvm_owner);
		uvm_owner = NULL;
		module_put(target_owner);
		return err;
	}
	hooked = true;
	return 0;
}

/**
 * qgpu_hook_exit() - unhook the target driver and let go of it
 *
 * Context: module exit, first.
 */
void qgpu_hook_exit(void)
{
	hooked = false;
	/*
	 * rmmod got here because no wrapper holds a reference, and no hook takes one any more. A
	 * task can still be on a hook, or on a wrapper's last instructions after its put:
	 * unregistering an ops in module memory waits for every CPU to schedule and, where the
	 * kernel is preemptible, for RCU-tasks, and either covers those few instructions.
	 */
	hook_unregister();
	if (uvm_owner)
		module_put(uvm_owner);
	module_put(target_owner);
}

/**
 * qgpu_hooked() - whether the driver's entry points are hooked
 *
 * Return: true between qgpu_hook_init() and qgpu_hook_exit().
 */
bool qgpu_hooked(void)
{
	return READ_ONCE(hooked);
}

/**
 * qgpu_uvm_hooked() - whether nvidia-uvm's mmap is hooked (managed memory refused to limited
 * cgroups)
 *
 * Return: true between qgpu_hook_init() and qgpu_hook_exit() where nvidia-uvm was found.
 */
bool qgpu_uvm_hooked(void)
{
	return READ_ONCE(hooked) && uvm_owner;
}
