// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: /dev/nvidia-uvm, the part of nvidia-uvm.ko that CUDA's start-up and its managed
 * memory go through (kernel-open/nvidia-uvm/uvm.c, uvm_va_range.c at 580.142).
 *
 * - A file does nothing until UVM_INITIALIZE: other ioctls answer NV_ERR_ILLEGAL_ACTION, mmap
 *   -EBADFD (uvm_linux_ioctl.h; the INIT_CHECK routes of uvm_api.h; uvm_mmap()).
 * - UVM_ALLOC_SEMAPHORE_POOL makes a range that the caller then maps with mmap at exactly its
 *   address and length (uvm_api_alloc_semaphore_pool(); uvm_mmap()'s pre-existing range). Such a
 *   mapping's vm_private_data is the vma itself. The pool is mapped on the CPU from that mmap
 *   until the mapping is unmapped, moved or split (uvm_mem_map_cpu_user(),
 *   uvm_vm_close_semaphore_pool(), uvm_vm_open_semaphore_pool()). UVM_FREE frees the range
 *   (uvm_free()), but not while the pool is mapped on the CPU (uvm_free_semaphore_pool():
 *   NV_ERR_INVALID_ARGUMENT, measured on an H100: rmcases.py uvm_pool_free).
 * - Each file has an address space of its own (uvm_open()), so that taking a file's pages off
 *   the CPU by file offset (= address) reaches only that file's mappings.
 * - An mmap anywhere else makes a managed range: cudaMallocManaged (uvm_mmap() calls
 *   uvm_va_range_create_mmap()). Its vm_private_data is a wrapper of the vma, never the vma
 *   (uvm_vma_wrapper_alloc()), and the range dies with the vma (uvm_vm_close_managed()).
 * - mmap needs offset == address and a shared, writable mapping (-EINVAL), and may not overlap
 *   another range (NV_ERR_UVM_ADDRESS_IN_USE, -EADDRINUSE: uvm_common.c).
 *
 * Measured on an H100 (580.159.04, BENCHMARKS.md 2026-11-27, eleventh session): CUDA's start-up
 * sends ALLOC_SEMAPHORE_POOL for 2 MiB and maps it; cuMemAllocManaged of 1 GiB is one mmap and no
 * ioctl, and takes device memory only when the GPU touches it. nvmock models the CPU side: a
 * managed page comes on the first CPU touch, from system memory. Not modelled: GPU faults and
 * migration, splitting a managed mapping (real UVM splits the range; nvmock refuses the split),
 * device-P2P ranges, and every other UVM ioctl (-ENOSYS, as uvm_test_ioctl() answers them
 * without the built-in tests).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "nvmock.h"

/* UVM_INIT_FLAGS_MASK (uvm_types.h): DISABLE_HMM | MULTI_PROCESS_SHARING_MODE. */
#define UVM_INIT_FLAGS_MASK	0x3ULL

/* nvmock's own bound on a semaphore pool's size (real UVM takes what memory allows). */
#define POOL_MAX_BYTES		(64ULL << 20)

atomic_t nvmock_uvm_ranges = ATOMIC_INIT(0);

struct uvm_range {
	struct list_head node;		/* uvm_space.ranges */
	u64 start, end;			/* [start, end) */
	bool pool;			/* made by ALLOC_SEMAPHORE_POOL; else managed */
	bool cpu_mapped;		/* a pool mapped by an mmap, not since unmapped */
	struct xarray pages;		/* by index from start: a pool's all, managed: touched */
};

struct uvm_space {
	struct mutex lock;		/* the fields below; taken under mmap_lock */
	u64 flags;
	bool initialized;
	struct list_head ranges;
};

/* A managed mapping's vm_private_data, as uvm_vma_wrapper_t is: never the vma itself. */
struct uvm_wrapper {
	struct vm_area_struct *vma;
	struct uvm_space *space;
	struct uvm_range *range;
};

static dev_t uvm_dev;
static struct cdev uvm_cdev;

static struct uvm_range *range_new(u64 start, u64 end, bool pool)
{
	struct uvm_range *r = kzalloc(sizeof(*r), GFP_KERNEL);

	if (!r)
		return NULL;
	r->start = start;
	r->end = end;
	r->pool = pool;
	xa_init(&r->pages);
	atomic_inc(&nvmock_uvm_ranges);
	return r;
}

/* Pages still mapped somewhere keep their own references (vm_insert_page()). */
static void range_free(struct uvm_range *r)
{
	struct page *page;
	unsigned long i;

	xa_for_each(&r->pages, i, page)
		put_page(page);
	xa_destroy(&r->pages);
	atomic_dec(&nvmock_uvm_ranges);
	kfree(r);
}

static struct uvm_range *range_overlapping(struct uvm_space *space, u64 start, u64 end)
{
	struct uvm_range *r;

	lockdep_assert_held(&space->lock);
	list_for_each_entry(r, &space->ranges, node)
		if (r->start < end && start < r->end)
			return r;
	return NULL;
}

/*
 * As uvm_open(): the file's own address space. Every file of the device shares the inode's,
 * and the mappings' offsets are their addresses, so unmapping by offset there would reach
 * another process's mappings at the same address.
 */
static int uvm_open(struct inode *inode, struct file *file)
{
	struct uvm_space *space = kzalloc(sizeof(*space), GFP_KERNEL);
	struct address_space *mapping = kzalloc(sizeof(*mapping), GFP_KERNEL);

	if (!space || !mapping) {
		kfree(mapping);
		kfree(space);
		return -ENOMEM;
	}
	mutex_init(&space->lock);
	INIT_LIST_HEAD(&space->ranges);
	address_space_init_once(mapping);
	mapping->host = inode;
	mapping->a_ops = inode->i_mapping->a_ops;
	file->f_mapping = mapping;
	file->private_data = space;
	return 0;
}

/* Every mapping holds the file, so none is left here, and only pools are left of the ranges. */
static int uvm_release(struct inode *inode, struct file *file)
{
	struct uvm_space *space = file->private_data;
	struct address_space *mapping = file->f_mapping;
	struct uvm_range *r, *next;

	list_for_each_entry_safe(r, next, &space->ranges, node) {
		list_del(&r->node);
		range_free(r);
	}
	kfree(space);
	file->f_mapping = NULL;
	kfree(mapping);
	return 0;
}

static u32 uvm_initialize(struct uvm_space *space, u64 flags)
{
	if (flags & ~UVM_INIT_FLAGS_MASK)
		return NV_ERR_INVALID_ARGUMENT;
	mutex_lock(&space->lock);
	if (!space->initialized) {
		space->initialized = true;
		space->flags = flags;
	} else if (flags != space->flags) {
		mutex_unlock(&space->lock);
		return NV_ERR_INVALID_ARGUMENT;
	}
	mutex_unlock(&space->lock);
	return NV_OK;
}

/* uvm_api_range_invalid(): page-aligned, not at 0, not empty, no wrap. */
static bool range_invalid(u64 base, u64 length)
{
	return !PAGE_ALIGNED(base) || !PAGE_ALIGNED(length) || !base || !length ||
	       base + length < base;
}

static u32 uvm_alloc_pool(struct uvm_space *space, const struct uvm_alloc_semaphore_pool_params *p)
{
	struct uvm_range *r;
	unsigned long i;
	u32 status = NV_OK;

	if (range_invalid(p->base, p->length))
		return NV_ERR_INVALID_ADDRESS;
	if (p->gpuAttributesCount > UVM_MAX_GPUS)
		return NV_ERR_INVALID_ARGUMENT;
	if (p->length > POOL_MAX_BYTES)
		return NV_ERR_NO_MEMORY;
	r = range_new(p->base, p->base + p->length, true);
	if (!r)
		return NV_ERR_NO_MEMORY;
	for (i = 0; i < p->length >> PAGE_SHIFT; i++) {
		struct page *page = alloc_page(GFP_KERNEL | __GFP_ZERO);

		if (!page || xa_err(xa_store(&r->pages, i, page, GFP_KERNEL))) {
			if (page)
				__free_page(page);
			range_free(r);
			return NV_ERR_NO_MEMORY;
		}
	}
	mutex_lock(&space->lock);
	if (range_overlapping(space, r->start, r->end))
		status = NV_ERR_UVM_ADDRESS_IN_USE;
	else
		list_add_tail(&r->node, &space->ranges);
	mutex_unlock(&space->lock);
	if (status)
		range_free(r);
	return status;
}

/*
 * uvm_free(): a range an ioctl made, named by its exact base and length; a pool still mapped on
 * the CPU is kept (uvm_free_semaphore_pool(): it must be unmapped first).
 */
static u32 uvm_free_range(struct uvm_space *space, u64 base, u64 length)
{
	struct uvm_range *r;

	if (range_invalid(base, length))
		return NV_ERR_INVALID_ADDRESS;
	mutex_lock(&space->lock);
	r = range_overlapping(space, base, base + 1);
	if (!r || !r->pool || r->start != base || r->end != base + length) {
		mutex_unlock(&space->lock);
		return NV_ERR_INVALID_ADDRESS;
	}
	if (r->cpu_mapped) {
		mutex_unlock(&space->lock);
		return NV_ERR_INVALID_ARGUMENT;
	}
	list_del(&r->node);
	mutex_unlock(&space->lock);
	range_free(r);
	return NV_OK;
}

/* As UVM_ROUTE_CMD_*: the whole struct in, the answer in rmStatus, the whole struct back. */
static long uvm_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct uvm_space *space = file->private_data;
	void __user *uarg = (void __user *)arg;
	bool initialized;

	mutex_lock(&space->lock);
	initialized = space->initialized;
	mutex_unlock(&space->lock);

	switch (cmd) {
	case UVM_INITIALIZE: {
		struct uvm_initialize_params p;

		if (copy_from_user(&p, uarg, sizeof(p)))
			return -EFAULT;
		p.rmStatus = uvm_initialize(space, p.flags);
		return copy_to_user(uarg, &p, sizeof(p)) ? -EFAULT : 0;
	}
	case UVM_DEINITIALIZE:
		return 0;
	case UVM_FREE: {
		struct uvm_free_params p;

		if (copy_from_user(&p, uarg, sizeof(p)))
			return -EFAULT;
		p.rmStatus = initialized ? uvm_free_range(space, p.base, p.length) :
					   NV_ERR_ILLEGAL_ACTION;
		return copy_to_user(uarg, &p, sizeof(p)) ? -EFAULT : 0;
	}
	case UVM_ALLOC_SEMAPHORE_POOL: {
		struct uvm_alloc_semaphore_pool_params *p = kmalloc(sizeof(*p), GFP_KERNEL);
		long ret = 0;

		if (!p)
			return -ENOMEM;
		if (copy_from_user(p, uarg, sizeof(*p))) {
			kfree(p);
			return -EFAULT;
		}
		p->rmStatus = initialized ? uvm_alloc_pool(space, p) : NV_ERR_ILLEGAL_ACTION;
		if (copy_to_user(uarg, p, sizeof(*p)))
			ret = -EFAULT;
		kfree(p);
		return ret;
	}
	default:
		/* as uvm_test_ioctl() answers without built-in tests */
		return -ENOSYS;
	}
}

static vm_fault_t uvm_fault_sigbus(struct vm_fault *vmf)
{
	return VM_FAULT_SIGBUS;
}

static const struct vm_operations_struct uvm_disabled_ops = {
	.fault = uvm_fault_sigbus,
};

/*
 * uvm_disable_vma(): every page at the mapping's file offsets taken off the CPU, in this file's
 * mappings only (uvm_open()): on a fork the parent's too (a managed one faults its pages back),
 * on a move or a split the other part's too. Its vm_private_data (the original's wrapper or
 * vma, copied) is not its own.
 */
static void disable_vma(struct vm_area_struct *vma)
{
	unmap_mapping_range(vma->vm_file->f_mapping, (loff_t)vma->vm_pgoff << PAGE_SHIFT,
			    vma->vm_end - vma->vm_start, 1);
	vma->vm_ops = &uvm_disabled_ops;
	vma->vm_private_data = NULL;
}

/* A copy of a managed mapping (fork with MADV_DOFORK, mremap): uvm_vm_open_managed(). */
static void uvm_managed_open(struct vm_area_struct *vma)
{
	disable_vma(vma);
}

static void uvm_managed_close(struct vm_area_struct *vma)
{
	struct uvm_wrapper *w = vma->vm_private_data;

	mutex_lock(&w->space->lock);
	list_del(&w->range->node);
	mutex_unlock(&w->space->lock);
	range_free(w->range);
	kfree(w);
}

static int uvm_managed_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	return -EINVAL;
}

/* First touch: a zeroed page of system memory, kept by the range until it dies. */
static vm_fault_t uvm_managed_fault(struct vm_fault *vmf)
{
	struct uvm_wrapper *w = vmf->vma->vm_private_data;
	unsigned long addr = vmf->address & PAGE_MASK;
	unsigned long index = (addr - w->range->start) >> PAGE_SHIFT;
	struct page *page;
	vm_fault_t ret = VM_FAULT_NOPAGE;
	int err;

	mutex_lock(&w->space->lock);
	page = xa_load(&w->range->pages, index);
	if (!page) {
		page = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!page || xa_err(xa_store(&w->range->pages, index, page, GFP_KERNEL))) {
			if (page)
				__free_page(page);
			mutex_unlock(&w->space->lock);
			return VM_FAULT_OOM;
		}
	}
	err = vm_insert_page(vmf->vma, addr, page);
	if (err && err != -EBUSY)	/* -EBUSY: another thread mapped it first */
		ret = err == -ENOMEM ? VM_FAULT_OOM : VM_FAULT_SIGBUS;
	mutex_unlock(&w->space->lock);
	return ret;
}

static const struct vm_operations_struct uvm_managed_ops = {
	.open = uvm_managed_open,
	.close = uvm_managed_close,
	.may_split = uvm_managed_may_split,
	.fault = uvm_managed_fault,
};

/* The pool mapped by [start, end) exactly, or NULL. */
static struct uvm_range *pool_at(struct uvm_space *space, u64 start, u64 end)
{
	struct uvm_range *r = range_overlapping(space, start, start + 1);

	return r && r->pool && r->start == start && r->end == end ? r : NULL;
}

/*
 * uvm_vm_close_semaphore_pool(): the pool is off the CPU once its mapping is unmapped. Where the
 * pool is gone (a second process's mapping of it, through the file passed on, outlived the
 * first's and the pool was freed in between), there is nothing to do.
 */
static void pool_off_cpu(struct vm_area_struct *vma)
{
	struct uvm_space *space = vma->vm_file->private_data;
	struct uvm_range *r;

	mutex_lock(&space->lock);
	r = pool_at(space, vma->vm_start, vma->vm_end);
	if (r)
		r->cpu_mapped = false;
	mutex_unlock(&space->lock);
}

static void uvm_pool_close(struct vm_area_struct *vma)
{
	pool_off_cpu(vma);
}

/*
 * uvm_vm_open_semaphore_pool(): a copy of a pool's mapping. On a fork (with MADV_DOFORK) the
 * child's copy is disabled and gets none of the pages (VM_WIPEONFORK); the parent's stays (real
 * UVM unmaps it and maps it again). On a move or a split both are disabled and the pool is off
 * the CPU: UVM_FREE may free it, and a touch of either part is SIGBUS (measured on an H100:
 * rmcases.py uvm_copies).
 */
static void uvm_pool_open(struct vm_area_struct *vma)
{
	struct vm_area_struct *origin = vma->vm_private_data;

	if (vma->vm_mm != origin->vm_mm) {
		vma->vm_flags |= VM_WIPEONFORK;
		vma->vm_ops = &uvm_disabled_ops;
		vma->vm_private_data = NULL;
		return;
	}
	pool_off_cpu(origin);
	disable_vma(origin);
	disable_vma(vma);
}

/* A pool's mapping only maps its pages; UVM_FREE destroys the range (uvm_vm_ops_semaphore_pool). */
static const struct vm_operations_struct uvm_pool_ops = {
	.open = uvm_pool_open,
	.close = uvm_pool_close,
	.fault = uvm_fault_sigbus,
};

/*
 * uvm_mem_map_cpu_user(): the pool's pages into this mapping, unless the pool is mapped already
 * (by another process, the file passed to it: this mapping then maps nothing, and a touch is
 * SIGBUS).
 */
static int map_pool(struct vm_area_struct *vma, struct uvm_range *r)
{
	struct page *page;
	unsigned long i;
	int err;

	vma->vm_private_data = vma;
	vma->vm_ops = &uvm_pool_ops;
	if (r->cpu_mapped)
		return 0;
	xa_for_each(&r->pages, i, page) {
		err = vm_insert_page(vma, r->start + (i << PAGE_SHIFT), page);
		if (err)
			return err;
	}
	r->cpu_mapped = true;
	return 0;
}

static int uvm_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct uvm_space *space = file->private_data;
	u64 start = vma->vm_start, end = vma->vm_end;
	struct uvm_wrapper *w;
	struct uvm_range *r;
	int err = 0;

	mutex_lock(&space->lock);
	if (!space->initialized) {
		err = -EBADFD;
		goto out;
	}
	if (vma->vm_start != vma->vm_pgoff << PAGE_SHIFT ||
	    (vma->vm_flags & (VM_SHARED | VM_READ | VM_WRITE)) !=
	    (VM_SHARED | VM_READ | VM_WRITE)) {
		err = -EINVAL;
		goto out;
	}
	vma->vm_flags |= VM_MIXEDMAP | VM_DONTEXPAND | VM_DONTCOPY;
	r = range_overlapping(space, start, end);
	if (r) {
		if (r->pool && r->start == start && r->end == end)
			err = map_pool(vma, r);
		else
			err = -EADDRINUSE;
		goto out;
	}
	w = kzalloc(sizeof(*w), GFP_KERNEL);
	r = w ? range_new(start, end, false) : NULL;
	if (!r) {
		kfree(w);
		err = -ENOMEM;
		goto out;
	}
	w->vma = vma;
	w->space = space;
	w->range = r;
	list_add_tail(&r->node, &space->ranges);
	vma->vm_private_data = w;
	vma->vm_ops = &uvm_managed_ops;
out:
	mutex_unlock(&space->lock);
	return err;
}

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open,
	.release = uvm_release,
	.unlocked_ioctl = uvm_ioctl,
	.mmap = uvm_mmap,
};

/**
 * nvmock_uvm_init() - register /dev/nvidia-uvm's character device
 *
 * As uvm_chardev_create(): a dynamic major named "nvidia-uvm", minor 0; the node is made by
 * userspace from /proc/devices.
 *
 * Context: module init.
 * Return: 0, or the error of registering the device.
 */
int nvmock_uvm_init(void)
{
	int err;

	err = alloc_chrdev_region(&uvm_dev, 0, 1, "nvidia-uvm");
	if (err)
		return err;
	cdev_init(&uvm_cdev, &uvm_fops);
	uvm_cdev.owner = THIS_MODULE;
	err = cdev_add(&uvm_cdev, uvm_dev, 1);
	if (err)
		unregister_chrdev_region(uvm_dev, 1);
	return err;
}

/**
 * nvmock_uvm_exit() - unregister /dev/nvidia-uvm
 *
 * Context: module exit; no file can be open (each holds the module).
 */
void nvmock_uvm_exit(void)
{
	cdev_del(&uvm_cdev);
	unregister_chrdev_region(uvm_dev, 1);
}
