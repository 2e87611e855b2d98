// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: what the hooks do around the driver's ioctl, mmap and release.
 *
 * Before the driver: the memory gate (an RM_ALLOC of device memory that would take a cgroup
 * past its limit is answered NV_ERR_NO_MEMORY, as the driver answers a full GPU) and the tenant
 * guard (a gated cgroup's own scheduling controls are refused or not carried out: see
 * tenant_verdict()).
 * After it: successful RM_ALLOC, RM_FREE and RM_MAP_MEMORY outcomes update the tracker.
 *
 * User memory is only touched with qgpu_lock dropped: a fault takes mmap_lock, and mmap runs
 * under mmap_lock and takes qgpu_lock.
 */
#include <linux/file.h>
#include <linux/mm.h>
#include <linux/uaccess.h>

#include "qgpu.h"

/* Offsets of the fields read from nv_memory_alloc_params and nvos*_params. */
#define MEM_PARAMS_SIZE_OFF	offsetof(struct nv_memory_alloc_params, size)
#define CHANNEL_USERD_MEM_OFF	offsetof(struct nv_channel_alloc_params, hUserdMemory)
#define CHANNEL_USERD_OFF_OFF	offsetof(struct nv_channel_alloc_params, userdOffset)

struct rm_alloc {
	u32 hroot, hparent, hnew, hclass;
	u64 params;
	u32 status;
	unsigned int status_off;
};

static int read_alloc(void __user *uarg, u32 size, struct rm_alloc *a)
{
	union {
		struct nvos21_params v21;
		struct nvos64_params v64;
	} p;

	if (size != sizeof(p.v21) && size != sizeof(p.v64))
		return -EINVAL;
	if (copy_from_user(&p, uarg, size))
		return -EFAULT;
	/* The first five fields of NVOS64 are NVOS21's. */
	a->hroot = p.v21.hRoot;
	a->hparent = p.v21.hObjectParent;
	a->hnew = p.v21.hObjectNew;
	a->hclass = p.v21.hClass;
	a->params = p.v21.pAllocParms;
	if (size == sizeof(p.v21)) {
		a->status = p.v21.status;
		a->status_off = offsetof(struct nvos21_params, status);
	} else {
		a->status = p.v64.status;
		a->status_off = offsetof(struct nvos64_params, status);
	}
	return 0;
}

static void answer(void __user *uarg, unsigned int status_off, u32 status)
{
	/* The caller sees a normal RM failure; a bad pointer is the caller's problem. */
	if (put_user(status, (u32 __user *)((u8 __user *)uarg + status_off)))
		return;
}

static struct qgpu_cg *owner_cg(u32 hclient, u64 caller_id)
{
	struct qgpu_client *client = qgpu_client_find(hclient);

	return client ? client->cg : qgpu_cg_get(caller_id, true);
}

static long rm_alloc(long (*orig)(struct file *, unsigned int, unsigned long), struct file *file,
		     unsigned int cmd, unsigned long arg, void __user *uarg, u32 size)
{
	u64 caller = qgpu_current_cgroup_id();
	u32 device_index = 0, userd_mem = 0;
	u64 userd_off = 0;
	struct qgpu_cg *cg;
	struct rm_alloc a;
	u64 bytes = 0, cg_id;
	bool refused = false, ok, kick = false;
	struct qgpu_obj *obj;
	long ret;

	if (read_alloc(uarg, size, &a))
		return orig(file, cmd, arg);
	if (a.hclass == NV01_MEMORY_LOCAL_USER && a.params &&
	    copy_from_user(&bytes, u64_to_user_ptr(a.params + MEM_PARAMS_SIZE_OFF), sizeof(bytes)))
		return orig(file, cmd, arg);
	if (a.hclass == NV01_DEVICE_0 && a.params &&
	    copy_from_user(&device_index, u64_to_user_ptr(a.params), sizeof(device_index)))
		return orig(file, cmd, arg);
	/* Where the channel's USERD is (userd.c); RM reads its own copy of the same. */
	if (qgpu_channel_class(a.hclass) && a.params &&
	    (copy_from_user(&userd_mem, u64_to_user_ptr(a.params + CHANNEL_USERD_MEM_OFF),
			    sizeof(userd_mem)) ||
	     copy_from_user(&userd_off, u64_to_user_ptr(a.params + CHANNEL_USERD_OFF_OFF),
			    sizeof(userd_off))))
		return orig(file, cmd, arg);

	mutex_lock(&qgpu_lock);
	cg = owner_cg(a.hroot, caller);
	if (!cg) {
		/* No memory for the record: the allocation goes through untracked. */
		mutex_unlock(&qgpu_lock);
		return orig(file, cmd, arg);
	}
	cg_id = cg->id;
	if (bytes) {
		if (cg->mem_limit &&
		    (bytes > cg->mem_limit || cg->mem_used > cg->mem_limit - bytes)) {
			cg->oom++;
			refused = true;
		} else {
			cg->mem_used += bytes;	/* reserved, so racing allocations see it */
		}
	}
	mutex_unlock(&qgpu_lock);
	if (refused) {
		answer(uarg, a.status_off, NV_ERR_NO_MEMORY);
		qgpu_event(QGPU_EVENT_OOM, cg_id, 0);
		return 0;
	}

	ret = orig(file, cmd, arg);

	/*
	 * What RM wrote back: its status and, when we asked for one, the new handle. The cgroup is
	 * looked up again: with nothing reserved it may have been dropped meanwhile.
	 */
	ok = ret == 0 && read_alloc(uarg, size, &a) == 0 && a.status == NV_OK;
	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(cg_id, true);
	if (ok && cg) {
		obj = qgpu_track_alloc(cg, file, a.hroot, a.hparent, a.hnew, a.hclass,
				       device_index, bytes);
		if (obj && obj->kind == QGPU_OBJ_CHANNEL)
			qgpu_userd_channel_alloc(a.hroot, obj, userd_mem, userd_off);
		/* A gated cgroup's new TSG: its timeslice may be qgpu's (timeslice.c). */
		kick = obj && obj->kind == QGPU_OBJ_TSG && cg->configured;
	} else if (cg) {
		cg->mem_used -= bytes;
		qgpu_cg_put_if_unused(cg);
	}
	mutex_unlock(&qgpu_lock);
	if (kick)
		qgpu_timeslice_kick();
	return ret;
}

static long rm_free(long (*orig)(struct file *, unsigned int, unsigned long), struct file *file,
		    unsigned int cmd, unsigned long arg, void __user *uarg, u32 size)
{
	struct nvos00_params p;
	long ret;

	/* RM tears down its mappings of what it frees: qgpu stops reading them first. */
	if (size == sizeof(p) && !copy_from_user(&p, uarg, sizeof(p))) {
		mutex_lock(&qgpu_lock);
		qgpu_userd_forget(p.hRoot, p.hObjectOld);
		mutex_unlock(&qgpu_lock);
	}
	ret = orig(file, cmd, arg);
	if (ret || size != sizeof(p) || copy_from_user(&p, uarg, sizeof(p)) || p.status != NV_OK)
		return ret;
	mutex_lock(&qgpu_lock);
	qgpu_track_free(p.hRoot, p.hObjectOld);
	mutex_unlock(&qgpu_lock);
	return ret;
}

/*
 * What the tenant guard does with a gated cgroup's own scheduling control: pass it, swallow it
 * (answered NV_OK, not carried out) or refuse it. CUDA sends GPFIFO_SCHEDULE(enable) and one
 * SET_TIMESLICE while it sets up a context and treats a failure as fatal; enabling does not
 * undo qgpu's FIFO_DISABLE_CHANNELS, and the timeslice stays qgpu's: the value asked for becomes
 * the TSG's own, which qgpu restores when it lets go of the TSG (timeslice.c).
 *
 * CUDA also sends one GR_SET_CTXSW_PREEMPTION_MODE then: CILP for compute, on its TSG (the H200
 * trace, qpolicy/nvrm/data/h200-pytorch-matmul.jsonl.gz). CILP is the finest preemption there
 * is, so that request passes; any other mode (WFI or CTA, or a graphics mode) would let the
 * context run on longer once qgpu's slice is over, and is refused. Everything else in
 * qgpu_scheduling_control() is refused: interleave levels, realtime TSGs, runlist restarts and
 * policies, stopping channels, preempting and disabling.
 */
enum verdict { PASS, SWALLOW, REFUSE };

static enum verdict preemption_verdict(const struct nvos54_params *p)
{
	struct nv2080_ctxsw_preemption_mode_params mode;

	if (p->paramsSize != sizeof(mode) ||
	    copy_from_user(&mode, u64_to_user_ptr(p->params), sizeof(mode)))
		return REFUSE;
	if (mode.flags == NV2080_CTXSW_PREEMPTION_FLAG_CILP &&
	    mode.cilpPreemptMode == NV2080_CTXSW_PREEMPTION_COMPUTE_CILP)
		return PASS;
	return REFUSE;
}

static enum verdict tenant_verdict(const struct nvos54_params *p)
{
	u8 enable;

	switch (p->cmd) {
	case NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
	case NVA06F_CTRL_CMD_GPFIFO_SCHEDULE:
		if (p->paramsSize < 1 || copy_from_user(&enable, u64_to_user_ptr(p->params), 1))
			return REFUSE;
		return enable ? PASS : REFUSE;
	case NVA06C_CTRL_CMD_SET_TIMESLICE:
		return SWALLOW;
	case NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE:
		return preemption_verdict(p);
	default:
		return REFUSE;
	}
}

/*
 * A tenant's SET_TIMESLICE that RM carried out: the TSG's own from now on, and whatever qgpu had
 * set there is gone (a request sent just before its cgroup was configured can land after qgpu's).
 */
static void timeslice_carried_out(struct file *file, void __user *uarg,
				  const struct nvos54_params *p, u64 us)
{
	u32 __user *ustatus = (u32 __user *)((u8 __user *)uarg +
					     offsetof(struct nvos54_params, status));
	bool tracked;
	u32 status;

	if (get_user(status, ustatus) || status != NV_OK)
		return;
	mutex_lock(&qgpu_lock);
	tracked = qgpu_timeslice_tenant(file, p->hClient, p->hObject, us, true);
	mutex_unlock(&qgpu_lock);
	if (tracked)
		qgpu_timeslice_kick();
}

static long rm_control(long (*orig)(struct file *, unsigned int, unsigned long),
		       struct file *file, unsigned int cmd, unsigned long arg, void __user *uarg,
		       u32 size)
{
	struct nvos54_params p;
	enum verdict verdict;
	struct qgpu_cg *cg;
	bool gated, timeslice;
	u64 id, us = 0;
	long ret;

	if (size != sizeof(p) || copy_from_user(&p, uarg, sizeof(p)) ||
	    !qgpu_scheduling_control(p.cmd))
		return orig(file, cmd, arg);
	/* A timeslice request's value, read once: the TSG's own from now on (timeslice.c). */
	timeslice = p.cmd == NVA06C_CTRL_CMD_SET_TIMESLICE &&
		    p.paramsSize == sizeof(struct nva06c_timeslice_params) &&
		    !copy_from_user(&us, u64_to_user_ptr(p.params), sizeof(us));
	id = qgpu_current_cgroup_id();
	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(id, false);
	gated = cg && cg->configured;
	mutex_unlock(&qgpu_lock);
	verdict = gated ? tenant_verdict(&p) : PASS;
	if (verdict == PASS) {
		ret = orig(file, cmd, arg);
		if (timeslice && !ret)
			timeslice_carried_out(file, uarg, &p, us);
		return ret;
	}
	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(id, false);
	if (cg)
		cg->denied++;
	if (verdict == SWALLOW && timeslice)
		qgpu_timeslice_tenant(file, p.hClient, p.hObject, us, false);
	mutex_unlock(&qgpu_lock);
	answer(uarg, offsetof(struct nvos54_params, status),
	       verdict == SWALLOW ? NV_OK : NV_ERR_INSUFFICIENT_PERMISSIONS);
	qgpu_event(QGPU_EVENT_DENIED, id, 0);
	return 0;
}

static long rm_map_memory(long (*orig)(struct file *, unsigned int, unsigned long),
			  struct file *file, unsigned int cmd, unsigned long arg,
			  void __user *uarg, u32 size)
{
	struct nvos33_params_with_fd p;
	struct file *target;
	long ret;

	ret = orig(file, cmd, arg);
	if (ret || size != sizeof(p) || copy_from_user(&p, uarg, sizeof(p)) || p.status != NV_OK)
		return ret;
	target = fget(p.fd);
	if (!target)
		return ret;
	mutex_lock(&qgpu_lock);
	qgpu_track_mapping(target, &p);
	mutex_unlock(&qgpu_lock);
	fput(target);
	return ret;
}

/* RM tears down the mapping it names: qgpu stops reading it first. */
static long rm_unmap_memory(long (*orig)(struct file *, unsigned int, unsigned long),
			    struct file *file, unsigned int cmd, unsigned long arg,
			    void __user *uarg, u32 size)
{
	struct nvos34_params p;

	if (size == sizeof(p) && !copy_from_user(&p, uarg, sizeof(p))) {
		mutex_lock(&qgpu_lock);
		qgpu_userd_unmap(p.hClient, p.hMemory, p.pLinearAddress);
		mutex_unlock(&qgpu_lock);
	}
	return orig(file, cmd, arg);
}

long qgpu_ioctl(long (*orig)(struct file *, unsigned int, unsigned long),
		struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	u32 nr = _IOC_NR(cmd);
	u32 size = _IOC_SIZE(cmd);

	if (_IOC_TYPE(cmd) != NVRM_IOCTL_MAGIC)
		return orig(file, cmd, arg);
	/* XFER carries the real request by pointer; policing it must not be a way around. */
	if (nr == NV_ESC_IOCTL_XFER_CMD) {
		struct nvrm_xfer xfer;

		if (size != sizeof(xfer) || copy_from_user(&xfer, uarg, sizeof(xfer)))
			return orig(file, cmd, arg);
		nr = xfer.cmd;
		size = xfer.size;
		uarg = u64_to_user_ptr(xfer.ptr);
	}
	switch (nr) {
	case NV_ESC_RM_ALLOC:
		return rm_alloc(orig, file, cmd, arg, uarg, size);
	case NV_ESC_RM_FREE:
		return rm_free(orig, file, cmd, arg, uarg, size);
	case NV_ESC_RM_CONTROL:
		return rm_control(orig, file, cmd, arg, uarg, size);
	case NV_ESC_RM_MAP_MEMORY:
		return rm_map_memory(orig, file, cmd, arg, uarg, size);
	case NV_ESC_RM_UNMAP_MEMORY:
		return rm_unmap_memory(orig, file, cmd, arg, uarg, size);
	default:
		return orig(file, cmd, arg);
	}
}

int qgpu_mmap(int (*orig)(struct file *, struct vm_area_struct *),
	      struct file *file, struct vm_area_struct *vma)
{
	int ret = orig(file, vma);

	if (ret)
		return ret;
	/* What it maps may hold channels' USERD: the scheduler reads it from there (userd.c). */
	mutex_lock(&qgpu_lock);
	qgpu_userd_mmap(file, vma);
	mutex_unlock(&qgpu_lock);
	return ret;
}

int qgpu_release(int (*orig)(struct inode *, struct file *), struct inode *inode,
		 struct file *file)
{
	int ret;

	/* The driver frees the clients that live on this file, and its mappings of their memory. */
	mutex_lock(&qgpu_lock);
	qgpu_userd_file_released(file);
	mutex_unlock(&qgpu_lock);
	ret = orig(inode, file);
	/* The driver has freed the clients that lived on this file; so do we. */
	mutex_lock(&qgpu_lock);
	qgpu_track_file_released(file);
	mutex_unlock(&qgpu_lock);
	return ret;
}
