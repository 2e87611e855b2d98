// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: managed memory (cudaMallocManaged) and the memory limit.
 *
 * nvidia-uvm makes managed memory without RM: an mmap of /dev/nvidia-uvm makes the range
 * (kernel-open/nvidia-uvm/uvm.c, uvm_mmap()), and its pages come into the GPU's memory from
 * UVM's own allocator when the GPU touches them (1 GiB of free memory gone after a memset by
 * the GPU, none before it: measured on an H100, BENCHMARKS.md 2026-11-27). No RM_ALLOC passes
 * the memory gate, and nothing tells qgpu how much of a range is resident. So a cgroup with a
 * memory limit is refused managed memory, as it is refused exports and fabric memory: its mmap
 * fails with -EPERM. Like every refusal a memory limit makes, whatever the tenant is answered,
 * it is the memory gate's: counted in oom and sent as QGPU_EVENT_OOM (refused_allocations in
 * qpolicy status). The errno is what the tenant learns: with an
 * mmap answered so (an LD_PRELOAD stand-in for this refusal, on an H100 and an H200),
 * cuMemAllocManaged returned CUDA_ERROR_NOT_PERMITTED for EPERM but CUDA_ERROR_UNKNOWN for
 * ENOMEM, EAGAIN and ENOSPC, and the process went on working either way (BENCHMARKS.md
 * 2026-11-27). A cgroup without a limit is not looked at further.
 *
 * Other mappings of a UVM file go through: CUDA maps a semaphore pool at start-up (2 MiB, made
 * by UVM_ALLOC_SEMAPHORE_POOL just before; measured on the same H100). Which mapping made a
 * managed range is read from what the driver left in the vma (uvm_mmap()): the mapping of a
 * range made before by an ioctl has vm_private_data == vma, a new managed range's mapping a
 * wrapper (uvm_vma_wrapper_alloc()), a mapping the driver disabled NULL. A managed range just
 * made is destroyed through the driver's own close (uvm_vm_close_managed(), as munmap would)
 * before the error goes back: the kernel never closes a vma whose mmap failed (mmap_region()),
 * and the vma's operations are emptied so that nothing of the driver's runs on it again.
 */
#include <linux/mm.h>

#include "qgpu.h"

static const struct vm_operations_struct refused_ops;

static bool made_managed_range(const struct vm_area_struct *vma)
{
	return vma->vm_private_data && vma->vm_private_data != vma && vma->vm_ops &&
	       vma->vm_ops->close;
}

/**
 * qgpu_uvm_mmap() - the hook around nvidia-uvm's mmap
 * @orig: the driver's own handler
 * @file: the UVM file
 * @vma: the mapping being made
 *
 * Context: process context, mmap_lock held for writing by the caller; takes qgpu_lock.
 * Return: what @orig returned, or -EPERM where it made managed memory for a cgroup with a
 * memory limit (the range is gone again).
 */
int qgpu_uvm_mmap(int (*orig)(struct file *, struct vm_area_struct *), struct file *file,
		  struct vm_area_struct *vma)
{
	u64 caller = qgpu_current_cgroup_id();
	int ret;

	if (!qgpu_gate_limited(caller))
		return orig(file, vma);
	ret = orig(file, vma);
	if (ret || !made_managed_range(vma))
		return ret;
	vma->vm_ops->close(vma);
	vma->vm_ops = &refused_ops;
	vma->vm_private_data = NULL;
	qgpu_gate_refused(caller);
	return -EPERM;
}
