// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: module set-up, the device nodes and their file operations.
 *
 * Like nvidia.ko it registers major 195: minors 0..N-1 ("nvidia", one per GPU) and 255
 * ("nvidiactl"), with one file_operations table for both; /dev entries are made by userspace.
 * /dev/nvidia-uvm, nvidia-uvm.ko's in a real system, is registered here too (uvm.c).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cdev.h>
#include <linux/fdtable.h>
#include <linux/file.h>
#include <linux/module.h>
#include <linux/slab.h>

#include "nvmock.h"

unsigned int nvmock_num_gpus = 1;
module_param_named(num_gpus, nvmock_num_gpus, uint, 0444);
MODULE_PARM_DESC(num_gpus, "GPUs to simulate: /dev/nvidia0..N-1 (1-8)");

static unsigned long fb_mib = 144384;	/* an H200: 141 GiB */
module_param(fb_mib, ulong, 0444);
MODULE_PARM_DESC(fb_mib, "Device memory per GPU, MiB");

/* RM's API lock: the object tree, mapping contexts, memory accounting (see nvmock.h). */
DEFINE_MUTEX(nvmock_lock);
struct nvmock_gpu nvmock_gpus[NVMOCK_MAX_GPUS];

static struct cdev gpu_cdev;
static struct cdev ctl_cdev;

struct nvmock_file *nvmock_file_of(struct file *file)
{
	return file->private_data;
}

static int nvmock_open(struct inode *inode, struct file *file)
{
	unsigned int minor = iminor(inode);
	struct nvmock_file *nf;

	if (minor != NVRM_CTL_MINOR && minor >= nvmock_num_gpus)
		return -ENXIO;
	nf = kzalloc(sizeof(*nf), GFP_KERNEL);
	if (!nf)
		return -ENOMEM;
	if (minor != NVRM_CTL_MINOR)
		nf->gpu = &nvmock_gpus[minor];
	file->private_data = nf;
	return 0;
}

static int nvmock_release(struct inode *inode, struct file *file)
{
	struct nvmock_file *nf = nvmock_file_of(file);

	/* Clients die with the file they were allocated through, as in RM. */
	nvmock_free_clients_of(file);
	mutex_lock(&nvmock_lock);
	nvmock_map_release(nf);
	nvmock_export_release(nf);
	mutex_unlock(&nvmock_lock);
	if (nf->ctl)
		fput(nf->ctl);
	kfree(nf);
	return 0;
}

/* Not const, like nvidia_fops: a hook finds it through an open file's f_op. */
const struct file_operations nvmock_fops = {
	.owner = THIS_MODULE,
	.open = nvmock_open,
	.release = nvmock_release,
	.unlocked_ioctl = nvmock_ioctl,
	.compat_ioctl = nvmock_ioctl,
	.mmap = nvmock_mmap,
	.llseek = noop_llseek,
};

static int gpu_file_matches(const void *index, struct file *file, unsigned int fd)
{
	struct nvmock_file *nf;

	if (file->f_op != &nvmock_fops)
		return 0;
	nf = nvmock_file_of(file);
	return nf->gpu && nf->gpu->index == *(const unsigned int *)index;
}

/* RM lets a process allocate a device only while it holds that GPU's device file open. */
bool nvmock_process_has_gpu_open(unsigned int index)
{
	if (!current->files)
		return false;
	return iterate_fd(current->files, 0, gpu_file_matches, &index) != 0;
}

static void nvmock_gpu_init(struct nvmock_gpu *gpu, unsigned int index)
{
	gpu->index = index;
	/* RM's gpu_id encodes the PCI bus; the mock puts each GPU on its own bus. */
	gpu->gpu_id = (0x18 + index) << 8;
	gpu->fb_size = (u64)fb_mib << 20;
	INIT_LIST_HEAD(&gpu->va_list);
	ida_init(&gpu->chids);
	ida_init(&gpu->tsg_ids);
}

static void nvmock_gpus_stop(unsigned int count)
{
	while (count--) {
		struct nvmock_gpu *gpu = &nvmock_gpus[count];

		nvmock_engine_stop(gpu);
		__free_page(gpu->usermode_page);
		ida_destroy(&gpu->chids);
		ida_destroy(&gpu->tsg_ids);
	}
}

static int nvmock_gpus_start(void)
{
	unsigned int i;
	int err;

	for (i = 0; i < nvmock_num_gpus; i++) {
		struct nvmock_gpu *gpu = &nvmock_gpus[i];

		nvmock_gpu_init(gpu, i);
		gpu->usermode_page = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!gpu->usermode_page) {
			err = -ENOMEM;
			goto err_stop;
		}
		err = nvmock_engine_start(gpu);
		if (err) {
			__free_page(gpu->usermode_page);
			goto err_stop;
		}
	}
	return 0;

err_stop:
	nvmock_gpus_stop(i);
	return err;
}

static int __init nvmock_init(void)
{
	dev_t gpu_dev = MKDEV(NVRM_MAJOR, 0);
	dev_t ctl_dev = MKDEV(NVRM_MAJOR, NVRM_CTL_MINOR);
	int err;

	if (nvmock_num_gpus < 1 || nvmock_num_gpus > NVMOCK_MAX_GPUS) {
		pr_err("num_gpus=%u: must be 1 to %d\n", nvmock_num_gpus, NVMOCK_MAX_GPUS);
		return -EINVAL;
	}
	if (!fb_mib) {
		pr_err("fb_mib=0: a GPU needs memory\n");
		return -EINVAL;
	}
	err = nvmock_bar1_init();
	if (err)
		return err;
	err = nvmock_gpus_start();
	if (err)
		goto err_bar1;

	err = register_chrdev_region(gpu_dev, nvmock_num_gpus, "nvidia");
	if (err)
		goto err_gpus;
	err = register_chrdev_region(ctl_dev, 1, "nvidiactl");
	if (err)
		goto err_gpu_region;

	cdev_init(&gpu_cdev, &nvmock_fops);
	gpu_cdev.owner = THIS_MODULE;
	err = cdev_add(&gpu_cdev, gpu_dev, nvmock_num_gpus);
	if (err)
		goto err_ctl_region;
	cdev_init(&ctl_cdev, &nvmock_fops);
	ctl_cdev.owner = THIS_MODULE;
	err = cdev_add(&ctl_cdev, ctl_dev, 1);
	if (err)
		goto err_gpu_cdev;
	err = nvmock_uvm_init();
	if (err)
		goto err_ctl_cdev;

	nvmock_debugfs_init();
	pr_info("%u GPU(s), %lu MiB each, driver version %s\n", nvmock_num_gpus, fb_mib,
		NVMOCK_VERSION_STRING);
	return 0;

err_ctl_cdev:
	cdev_del(&ctl_cdev);
err_gpu_cdev:
	cdev_del(&gpu_cdev);
err_ctl_region:
	unregister_chrdev_region(ctl_dev, 1);
err_gpu_region:
	unregister_chrdev_region(gpu_dev, nvmock_num_gpus);
err_gpus:
	nvmock_gpus_stop(nvmock_num_gpus);
err_bar1:
	nvmock_bar1_exit();
	return err;
}

static void __exit nvmock_exit(void)
{
	/* No file can be open: each holds a reference on the module. Kernel clients may be left. */
	nvmock_free_clients_of(NULL);
	nvmock_debugfs_exit();
	nvmock_uvm_exit();
	cdev_del(&ctl_cdev);
	cdev_del(&gpu_cdev);
	unregister_chrdev_region(MKDEV(NVRM_MAJOR, NVRM_CTL_MINOR), 1);
	unregister_chrdev_region(MKDEV(NVRM_MAJOR, 0), nvmock_num_gpus);
	nvmock_gpus_stop(nvmock_num_gpus);
	nvmock_bar1_exit();
}

module_init(nvmock_init);
module_exit(nvmock_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Mock NVIDIA GPU driver speaking the RM ABI, with a simulated engine");
MODULE_AUTHOR("qpolicy developers");
