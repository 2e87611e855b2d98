// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: what the hooks do around the driver's ioctl, mmap and release.
 *
 * The memory gate (device memory past a cgroup's limit is answered NV_ERR_NO_MEMORY, as the
 * driver answers a full GPU; see the comment above rm_fact()), the tracker (RM_ALLOC, RM_FREE,
 * RM_DUP_OBJECT, RM_VID_HEAP_CONTROL, learnt from RM after the call) and the tenant guard (a
 * gated cgroup's own scheduling controls are refused or not carried out: see tenant_verdict()).
 * Every refusal is counted on the cgroup and sent as an event: one the memory gate makes because
 * of a memory limit in oom (QGPU_EVENT_OOM), whatever status or errno the tenant is answered,
 * one of the tenant guard or of the handle rules (unnamed_refused(), another file's client) in
 * denied (QGPU_EVENT_DENIED).
 *
 * User memory is only touched with qgpu_lock dropped: a fault takes mmap_lock, and mmap runs
 * under mmap_lock and takes qgpu_lock.
 */
#include <linux/file.h>
#include <linux/lockdep.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "qgpu.h"

/* Offsets of the fields read from nv_memory_alloc_params. */
#define MEM_PARAMS_SIZE_OFF	offsetof(struct nv_memory_alloc_params, size)
#define CHANNEL_USERD_MEM_OFF	offsetof(struct nv_channel_alloc_params, hUserdMemory)
#define CHANNEL_USERD_OFF_OFF	offsetof(struct nv_channel_alloc_params, userdOffset)

/*
 * NVOS32: what qgpu decides on (through ALLOC_SIZE's size, which lies past ALLOC_SIZE_RANGE's
 * size and ALLOC_TILED_PITCH_HEIGHT's height, pitch and attr, and FREE's flags), and what it
 * reads of the answer.
 */
#define VID_HEAP_CHECKED	offsetofend(struct nvos32_params, size)
#define VID_HEAP_ANSWER		offsetofend(struct nvos32_params, hMemory)

static void untrack_if_gone(struct file *file, u32 hclient, u32 hobject);

struct rm_alloc {
	u32 hroot, hparent, hnew, hclass;
	u64 params;
	u32 status;
	unsigned int status_off;
};

/* An RM_ALLOC's argument as the caller sent it: NVOS21 or NVOS64, by its size. */
union alloc_args {
	struct nvos21_params v21;
	struct nvos64_params v64;
};

/* The first five fields of NVOS64 are NVOS21's. */
static void parse_alloc(const union alloc_args *p, u32 size, struct rm_alloc *a)
{
	a->hroot = p->v21.hRoot;
	a->hparent = p->v21.hObjectParent;
	a->hnew = p->v21.hObjectNew;
	a->hclass = p->v21.hClass;
	a->params = p->v21.pAllocParms;
	if (size == sizeof(p->v21)) {
		a->status = p->v21.status;
		a->status_off = offsetof(struct nvos21_params, status);
	} else {
		a->status = p->v64.status;
		a->status_off = offsetof(struct nvos64_params, status);
	}
}

static int read_alloc(void __user *uarg, u32 size, union alloc_args *p, struct rm_alloc *a)
{
	if (size != sizeof(p->v21) && size != sizeof(p->v64))
		return -EINVAL;
	if (copy_from_user(p, uarg, size))
		return -EFAULT;
	parse_alloc(p, size, a);
	return 0;
}

static void answer(void __user *uarg, unsigned int status_off, u32 status)
{
	/* The caller sees a normal RM failure; a bad pointer is the caller's problem. */
	if (put_user(status, (u32 __user *)((u8 __user *)uarg + status_off)))
		return;
}

static bool is_client_class(u32 hclass)
{
	return hclass == NV01_ROOT || hclass == NV01_ROOT_NON_PRIV || hclass == NV01_ROOT_CLIENT;
}

/*
 * The memory gate. nvidia_ioctl copies the argument in once and works on that copy; whatever
 * qgpu reads from the tenant's memory is another fetch, which a tenant thread may have rewritten
 * in between. So qgpu reads the argument once, before the call, and uses that copy only to
 * refuse early (a size already past the limit, another file's client). What it records after
 * the call it asks RM through the kernel client (rmapi.c): whether the handle exists, its class,
 * its parent, a memory object's size as RM allocated it. The handles it asks about are those of
 * its own copy and those the driver wrote back; a handle RM does not confirm is not recorded.
 * Memory that would take a cgroup past its limit is freed again through the kernel client and
 * the call answered NV_ERR_NO_MEMORY, as the driver answers a full GPU.
 *
 * Without the driver's RM entry (rmapi.c) none of that can be asked: qgpu then charges the size
 * of its own copy and believes the status and handle written back, as before.
 */

/* What RM says a handle is, learnt through the kernel client. */
struct rm_fact {
	u32 hclient;		/* the client it is in (itself for a client) */
	u32 handle;
	u32 hclass;
	u32 hparent;
	u64 bytes;		/* memory: its size as RM allocated it */
	bool sized;		/* memory: RM answered its size */
};

/* A candidate (client, handle) to ask RM about; 0 in handle for none. */
struct rm_pair {
	u32 hclient, handle;
};

/*
 * What RM has at (hclient, handle): an object of hclient, or else a client of its own named by
 * handle (what a client allocation makes). Process context, qgpu_lock not held.
 */
static bool rm_fact(u32 hclient, u32 handle, struct rm_fact *f)
{
	memset(f, 0, sizeof(*f));
	if (!handle)
		return false;
	if (hclient && hclient != handle &&
	    qgpu_rmapi_handle_info(hclient, handle, NV0000_HANDLE_INFO_INDEX_CLASSID,
				   &f->hclass) == NV_OK &&
	    qgpu_rmapi_handle_info(hclient, handle, NV0000_HANDLE_INFO_INDEX_PARENT,
				   &f->hparent) == NV_OK) {
		f->hclient = hclient;
		f->handle = handle;
		f->sized = qgpu_mem_class(f->hclass) &&
			   qgpu_rmapi_mem_size(hclient, handle, &f->bytes) == NV_OK;
		return true;
	}
	if (qgpu_rmapi_handle_info(handle, handle, NV0000_HANDLE_INFO_INDEX_CLASSID,
				   &f->hclass) == NV_OK && is_client_class(f->hclass)) {
		f->hclient = handle;
		f->handle = handle;
		return true;
	}
	return false;
}

/* How a confirmed object is charged. */
struct rm_charge {
	u32 device_index;	/* a device: the GPU its parameters named */
	u32 dup_of;		/* a duplicate RM confirmed of this memory object, same client */
	u32 userd_mem;		/* a channel: the memory its USERD is in (0: RM's own) */
	u64 userd_off;		/* and where in it */
};

/*
 * Record what RM confirmed. A client goes to the caller's cgroup; an object to its client's,
 * unless that client lives on another file (never charged for what this file did). Memory is
 * charged RM's size, or refused (*refuse set, nothing recorded) past the limit, or when RM did
 * not say its size and the cgroup has a limit, or for fabric memory in a limited cgroup. A
 * record RM's answer agrees with is left as it is; one it does not is of an object freed since
 * and is replaced.
 * Context: qgpu_lock held.
 */
static struct qgpu_obj *track_fact(struct file *file, u64 caller, const struct rm_fact *f,
				   const struct rm_charge *how, bool *refuse)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj, *orig = NULL;
	struct qgpu_cg *cg;
	bool mem = qgpu_mem_class(f->hclass);

	lockdep_assert_held(&qgpu_lock);
	*refuse = false;
	if (f->hclient == f->handle) {
		client = qgpu_client_find(f->handle);
		if (client) {
			qgpu_track_confirmed(client, NULL);
			return NULL;
		}
		cg = qgpu_cg_get(caller, true);
		if (cg) {
			qgpu_track_alloc(cg, file, 0, 0, f->handle, f->hclass, 0);
			qgpu_cg_put_if_unused(cg);
		}
		return NULL;
	}
	client = qgpu_client_find(f->hclient);
	if (client && client->file != file)
		return NULL;
	obj = client ? qgpu_obj_find(client, f->handle) : NULL;
	if (obj && qgpu_track_agrees(obj, f->hparent, f->hclass, f->sized ? f->bytes : 0)) {
		qgpu_track_confirmed(client, obj);
		return NULL;
	}
	/* RM has another object there now: the record is of one freed since. */
	if (obj)
		qgpu_track_free(f->hclient, f->handle);
	cg = client ? client->cg : qgpu_cg_get(caller, true);
	if (!cg)
		return NULL;
	if (client && how->dup_of)
		orig = qgpu_obj_find(client, how->dup_of);
	if (mem && !(orig && orig->mem)) {
		if (cg->mem_limit && (!f->sized || f->hclass == NV_MEMORY_FABRIC ||
				      !qgpu_gate_fits(cg, f->bytes))) {
			cg->oom++;
			*refuse = true;
			qgpu_cg_put_if_unused(cg);
			return NULL;
		}
	}
	obj = qgpu_track_alloc(cg, file, f->hclient, f->hparent, f->handle, f->hclass,
			       how->device_index);
	if (obj && obj->kind == QGPU_OBJ_CHANNEL)
		qgpu_userd_channel_alloc(f->hclient, obj, how->userd_mem, how->userd_off);
	if (obj && orig && orig->mem)
		qgpu_gate_share(obj, orig);
	else if (obj && mem && f->sized)
		qgpu_gate_charge(obj, cg, f->bytes);
	if (!obj)
		qgpu_cg_put_if_unused(cg);
	return obj;
}

/*
 * How many times an account that a free in the same client crossed is asked of RM again; the
 * last answer is then taken as it is (see learn() and untrack_if_gone()).
 */
#define ACCOUNT_TRIES	8

/*
 * What RM has at one candidate, asked with no lock held; returns with qgpu_lock held, and
 * whether RM knows the handle. The answer is asked again while an RM_FREE in its client
 * returned during the query (track.c): the object might be gone already, or its client.
 */
static bool rm_fact_locked(const struct rm_pair *pair, struct rm_fact *f)
{
	bool known;
	int tries;
	u64 seq;

	for (tries = 1; ; tries++) {
		mutex_lock(&qgpu_lock);
		seq = qgpu_track_seq();
		mutex_unlock(&qgpu_lock);
		known = rm_fact(pair->hclient, pair->handle, f);
		mutex_lock(&qgpu_lock);
		if (!known || tries >= ACCOUNT_TRIES || !qgpu_track_freed_since(f->hclient, seq))
			return known;
		mutex_unlock(&qgpu_lock);
	}
}

/* A TSG, or a compute object making its TSG a CUDA context: timeslice.c looks again. */
static bool moves_timeslices(const struct qgpu_obj *obj)
{
	return obj->kind == QGPU_OBJ_TSG || obj->kind == QGPU_OBJ_COMPUTE;
}

/*
 * Learn what the call made at each candidate and record it, settling the call's reservation
 * (@resv, may be NULL) on the first record; memory refused is freed through the kernel client
 * and the call answered NV_ERR_NO_MEMORY at status_off. Returns whether a gated cgroup got a
 * new TSG (its timeslice may be qgpu's: timeslice.c).
 * Context: no qgpu lock held.
 */
static bool learn(struct file *file, u64 caller, const struct rm_pair *pairs, int n,
		  const struct rm_charge *how, struct qgpu_resv *resv, void __user *uarg,
		  unsigned int status_off)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;
	struct qgpu_cg *cg;
	struct rm_fact f;
	bool kick = false, refuse, known;
	u64 cg_id = 0;
	int i, j;

	for (i = 0; i < n; i++) {
		for (j = 0; j < i; j++)
			if (pairs[j].hclient == pairs[i].hclient &&
			    pairs[j].handle == pairs[i].handle)
				break;
		if (j < i)
			continue;
		known = rm_fact_locked(&pairs[i], &f);
		/* What RM allocated is charged in place of what was reserved (gate.c). */
		qgpu_gate_unreserve(resv);
		refuse = false;
		obj = known ? track_fact(file, caller, &f, how, &refuse) : NULL;
		if (obj && moves_timeslices(obj)) {
			client = qgpu_client_find(f.hclient);
			kick |= client && client->cg->configured;
		}
		if (refuse) {
			client = qgpu_client_find(f.hclient);
			cg_id = client ? client->cg->id : caller;
		}
		mutex_unlock(&qgpu_lock);
		if (!refuse)
			continue;
		if (qgpu_rmapi_free(f.hclient, f.handle) == NV_OK) {
			mutex_lock(&qgpu_lock);
			qgpu_track_freeing(file, f.hclient, false);
			mutex_unlock(&qgpu_lock);
			answer(uarg, status_off, NV_ERR_NO_MEMORY);
			qgpu_event(QGPU_EVENT_OOM, cg_id, 0);
			continue;
		}
		/* RM kept it: charged past the limit rather than not at all. */
		mutex_lock(&qgpu_lock);
		client = qgpu_client_find(f.hclient);
		cg = client ? client->cg : qgpu_cg_get(caller, true);
		obj = NULL;
		if (cg && !(client && qgpu_obj_find(client, f.handle)))
			obj = qgpu_track_alloc(cg, file, f.hclient, f.hparent, f.handle, f.hclass,
					       how->device_index);
		if (obj)
			qgpu_gate_charge(obj, cg, f.bytes);
		else if (cg)
			qgpu_cg_put_if_unused(cg);
		mutex_unlock(&qgpu_lock);
	}
	return kick;
}

/*
 * Without the RM entry: the driver's status and handle as written back, the class and size of
 * qgpu's own copy (a tenant racing its buffer is not caught then), settling the reservation.
 */
static bool believe(struct file *file, u64 caller, const struct rm_fact *f, u64 asked,
		    const struct rm_charge *how, struct qgpu_resv *resv)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;
	struct qgpu_cg *cg;
	bool kick = false;

	mutex_lock(&qgpu_lock);
	/* What was reserved is charged now: it fit then. */
	qgpu_gate_unreserve(resv);
	client = qgpu_client_find(f->hclient);
	cg = client ? client->cg : qgpu_cg_get(caller, true);
	if (f->hclient == f->handle || !client || client->file == file) {
		obj = cg ? qgpu_track_alloc(cg, file, f->hclient, f->hparent, f->handle,
					    f->hclass, how->device_index) : NULL;
		if (obj && obj->kind == QGPU_OBJ_CHANNEL)
			qgpu_userd_channel_alloc(f->hclient, obj, how->userd_mem, how->userd_off);
		if (obj && qgpu_mem_class(f->hclass))
			qgpu_gate_charge(obj, cg, asked);
		kick = obj && moves_timeslices(obj) && cg->configured;
	}
	if (cg)
		qgpu_cg_put_if_unused(cg);
	mutex_unlock(&qgpu_lock);
	return kick;
}

/*
 * Whether a call of (or charged to) @cg reaches RM only as qgpu read it, and qgpu learns what
 * RM answered from the driver's copy (rmprobe.c): where the cgroup is configured or has a
 * memory limit. Every other caller's calls go as before, unprobed.
 * Context: qgpu_lock held.
 */
static bool checked_cg(const struct qgpu_cg *cg)
{
	lockdep_assert_held(&qgpu_lock);
	return cg && (cg->configured || cg->mem_limit);
}

/*
 * An object whose handle RM is left to pick: a zero handle makes RM generate one and write it
 * back (clientAssignResourceHandle, src/nvidia/src/libraries/resserv/src/rs_client.c, for
 * serverAllocResource and serverCopyResource). That handle is known only from the tenant's
 * buffer, which a tenant thread may rewrite before qgpu reads it: the object would then be
 * neither tracked, nor charged, nor sliced. So a configured cgroup must name its objects
 * (clients excepted: what is made under an unknown client is tracked all the same). libcuda
 * names every object it makes (171 RM_ALLOC in the shipped H200 trace, none with a zero handle).
 */
static bool unnamed_refused(const struct qgpu_cg *cg, u32 hnew, bool client)
{
	return cg && cg->configured && !hnew && !client;
}

/*
 * Before the call, on qgpu's one copy: whether to refuse it at once. hroot naming another
 * file's client may not be charged to that client's cgroup, and RM refuses it from here anyway
 * (rmclientValidate, src/nvidia/src/kernel/rmapi/client.c); memory is refused then. An object
 * left for RM to name is refused to a configured cgroup (unnamed_refused()). Fabric memory is
 * refused to a memory-limited cgroup (its export escapes qgpu), and memory asked for past the
 * limit is refused before RM rounds it up. Memory let through is reserved in @resv (gate.c),
 * for the caller to settle once RM answered. @checked says, on the same lookup, whether the
 * call is to reach RM only as qgpu read it (checked()).
 *
 * The two refusals that exist only because the cgroup has a memory limit are the memory gate's
 * and count as oom, whatever status the tenant gets; the handle rules (another file's client,
 * an unnamed object) count as denied. See QGPU_A_OOM and QGPU_A_DENIED in uapi/qgpu.h.
 */
static u32 refuse_early(struct file *file, u64 caller, u32 hroot, u32 hnew, u32 hclass,
			u64 asked, u64 *cg_id, struct qgpu_resv *resv, bool *checked)
{
	struct qgpu_client *client;
	struct qgpu_cg *cg;
	u32 refusal = NV_OK;
	bool limit = false;

	mutex_lock(&qgpu_lock);
	client = is_client_class(hclass) ? NULL : qgpu_client_find(hroot);
	cg = client ? client->cg : qgpu_cg_get(caller, false);
	*checked = checked_cg(cg) || checked_cg(qgpu_cg_get(caller, false));
	if (client && client->file != file) {
		cg = qgpu_cg_get(caller, false);
		if (qgpu_mem_class(hclass))
			refusal = NV_ERR_INVALID_CLIENT;
	} else if (unnamed_refused(cg, hnew, is_client_class(hclass))) {
		refusal = NV_ERR_INSUFFICIENT_PERMISSIONS;
	} else if (cg && hclass == NV_MEMORY_FABRIC && cg->mem_limit) {
		refusal = NV_ERR_INSUFFICIENT_PERMISSIONS;
		limit = true;
	} else if (cg && qgpu_mem_class(hclass) && asked && !qgpu_gate_reserve(cg, asked, resv)) {
		refusal = NV_ERR_NO_MEMORY;
		limit = true;
	}
	*cg_id = cg ? cg->id : caller;
	if (cg && limit)
		cg->oom++;
	else if (cg && refusal != NV_OK)
		cg->denied++;
	mutex_unlock(&qgpu_lock);
	if (refusal != NV_OK)
		qgpu_event(limit ? QGPU_EVENT_OOM : QGPU_EVENT_DENIED, *cg_id, 0);
	return refusal;
}

/* What is left of a reservation once the call is accounted for goes back. */
static void settle(struct qgpu_resv *resv)
{
	if (!resv->cg)
		return;
	mutex_lock(&qgpu_lock);
	qgpu_gate_unreserve(resv);
	mutex_unlock(&qgpu_lock);
}

static long rm_alloc(long (*orig)(struct file *, unsigned int, unsigned long), struct file *file,
		     unsigned int cmd, unsigned long arg, void __user *uarg, u32 size)
{
	struct qgpu_resv resv = { 0 };
	u64 caller = qgpu_current_cgroup_id(), asked = 0, cg_id;
	struct rm_charge how = { 0 };
	struct rm_alloc a, after;
	struct rm_pair pairs[2];
	bool kick, have_after, checked;
	enum qgpu_reply reply;
	union alloc_args raw;
	int slot = -1;
	u32 refusal;
	long ret;

	if (read_alloc(uarg, size, &raw, &a))
		return orig(file, cmd, arg);
	/* Read once, to refuse early only: what is charged is what RM allocated. */
	if (a.hclass == NV01_MEMORY_LOCAL_USER && a.params &&
	    copy_from_user(&asked, u64_to_user_ptr(a.params + MEM_PARAMS_SIZE_OFF), sizeof(asked)))
		asked = 0;
	if (a.hclass == NV01_DEVICE_0 && a.params &&
	    copy_from_user(&how.device_index, u64_to_user_ptr(a.params), sizeof(u32)))
		how.device_index = 0;
	/* Where a channel's USERD is (userd.c), on the same copy; RM reads its own. */
	if (qgpu_channel_class(a.hclass) && a.params &&
	    (copy_from_user(&how.userd_mem, u64_to_user_ptr(a.params + CHANNEL_USERD_MEM_OFF),
			    sizeof(how.userd_mem)) ||
	     copy_from_user(&how.userd_off, u64_to_user_ptr(a.params + CHANNEL_USERD_OFF_OFF),
			    sizeof(how.userd_off)))) {
		how.userd_mem = 0;
		how.userd_off = 0;
	}

	refusal = refuse_early(file, caller, a.hroot, a.hnew, a.hclass, asked, &cg_id, &resv,
			       &checked);
	if (refusal != NV_OK) {
		answer(uarg, a.status_off, refusal);
		return 0;
	}
	/* Everything before the status reaches RM as qgpu read it, or not at all (rmprobe.c). */
	if (checked)
		slot = qgpu_expect(NV_ESC_RM_ALLOC, &raw, a.status_off, a.status_off);
	ret = orig(file, cmd, arg);
	reply = qgpu_expect_done(slot, &raw, size);
	if (reply == QGPU_REPLY_NONE) {
		settle(&resv);
		return ret;
	}
	/*
	 * What RM wrote back, from the driver's copy where it was kept, else from the caller's
	 * memory: a failed copy-out (-EFAULT) may follow a call RM carried out, so RM is asked all
	 * the same.
	 */
	if (reply == QGPU_REPLY_RM) {
		parse_alloc(&raw, size, &after);
		have_after = true;
	} else {
		have_after = read_alloc(uarg, size, &raw, &after) == 0;
	}
	if (qgpu_rmapi_available()) {
		pairs[0] = (struct rm_pair){ a.hroot, a.hnew };
		pairs[1] = have_after ? (struct rm_pair){ after.hroot, after.hnew } :
			   (struct rm_pair){ 0, 0 };
		kick = learn(file, caller, pairs, 2, &how, &resv, uarg, a.status_off);
	} else if (!ret && have_after && after.status == NV_OK) {
		struct rm_fact f = {
			.hclient = is_client_class(a.hclass) ? after.hnew : a.hroot,
			.handle = after.hnew,
			.hclass = a.hclass,
			.hparent = a.hparent,
		};

		kick = believe(file, caller, &f, asked, &how, &resv);
	} else {
		kick = false;
	}
	settle(&resv);
	if (kick)
		qgpu_timeslice_kick();
	return ret;
}

/*
 * The video memory an NVOS32 function of qgpu's copy asks for, in @asked: ALLOC_SIZE's size,
 * ALLOC_SIZE_RANGE's, or ALLOC_TILED_PITCH_HEIGHT's height * pitch (pitch signed, as RM
 * multiplies them), each where nvos.h's union has it (nvrm.h's NVRM_NVOS32_*_OFF). False for
 * every other function, for virtual memory and for a location other than video memory.
 */
static bool vid_heap_vidmem(const struct nvos32_params *k, u64 *asked)
{
	const u8 *raw = (const u8 *)k;
	u32 attr = k->attr;

	switch (k->function) {
	case NVOS32_FUNCTION_ALLOC_SIZE:
		*asked = k->size;
		break;
	case NVOS32_FUNCTION_ALLOC_SIZE_RANGE:
		memcpy(asked, raw + NVRM_NVOS32_RANGE_SIZE_OFF, sizeof(*asked));
		break;
	case NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT: {
		u32 height;
		s32 pitch;

		memcpy(&height, raw + NVRM_NVOS32_TILED_HEIGHT_OFF, sizeof(height));
		memcpy(&pitch, raw + NVRM_NVOS32_TILED_PITCH_OFF, sizeof(pitch));
		memcpy(&attr, raw + NVRM_NVOS32_TILED_ATTR_OFF, sizeof(attr));
		*asked = (u64)height * (u64)(s64)pitch;
		break;
	}
	default:
		return false;
	}
	return !(k->flags & NVOS32_ALLOC_FLAGS_VIRTUAL) &&
	       ((attr >> NVOS32_ATTR_LOCATION_SHIFT) & NVOS32_ATTR_LOCATION_MASK) ==
	       NVOS32_ATTR_LOCATION_VIDMEM;
}

/*
 * RM_VID_HEAP_CONTROL (src/nvidia/interface/deprecated/rmapi_deprecated_vidheapctrl.c). Its
 * ALLOC_SIZE, ALLOC_SIZE_RANGE and ALLOC_TILED_PITCH_HEIGHT each make NV01_MEMORY_LOCAL_USER
 * (attr LOCATION VIDMEM) at hMemory under hObjectParent (_rmVidHeapControlAllocCommon), and are
 * gated as RM_ALLOC of that class; RM is asked about hMemory whatever allocating function
 * qgpu's copy names. Its FREE frees hMemory (_nvos32FunctionFree) and is followed as RM_FREE
 * is: USERD in it is no longer read, and its charge goes once RM confirms it gone. Measured on
 * an H100: all three allocate, FREE frees (tests/vm/rmcases.py vid_heap_functions).
 */
static long rm_vid_heap(long (*orig)(struct file *, unsigned int, unsigned long),
			struct file *file, unsigned int cmd, unsigned long arg, void __user *uarg,
			u32 size)
{
	u64 caller = qgpu_current_cgroup_id(), asked = 0, cg_id;
	const unsigned int status_off = offsetof(struct nvos32_params, status);
	struct nvos32_params *k, *after;
	struct qgpu_resv resv = { 0 };
	struct rm_charge how = { 0 };
	struct rm_pair pairs[2];
	enum qgpu_reply reply;
	bool vidmem, checked, freeing;
	int slot = -1;
	u32 refusal;
	u32 named;
	long ret;

	if (size != sizeof(*k))
		return orig(file, cmd, arg);
	k = kmalloc(2 * sizeof(*k), GFP_KERNEL);
	if (!k)
		return -ENOMEM;
	after = k + 1;
	if (copy_from_user(k, uarg, sizeof(*k))) {
		kfree(k);
		return orig(file, cmd, arg);
	}
	vidmem = vid_heap_vidmem(k, &asked);
	if (!vidmem)
		asked = 0;
	freeing = k->function == NVOS32_FUNCTION_FREE;
	if (freeing) {
		/* RM tears down its mappings of what it frees: qgpu stops reading them first. */
		mutex_lock(&qgpu_lock);
		qgpu_userd_forget(k->hRoot, k->hMemory);
		mutex_unlock(&qgpu_lock);
	}

	/* Without MEMORY_HANDLE_PROVIDED RM picks hMemory (_rmVidHeapControlAllocCommon). */
	named = !vidmem ? 1 :
		k->flags & NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED ? k->hMemory : 0;
	refusal = refuse_early(file, caller, k->hRoot, named,
			       vidmem ? NV01_MEMORY_LOCAL_USER : NV01_MEMORY_SYSTEM, asked, &cg_id,
			       &resv, &checked);
	if (refusal != NV_OK) {
		answer(uarg, status_off, refusal);
		kfree(k);
		return 0;
	}
	/*
	 * Checked up to ALLOC_SIZE's size: the function, flags, attr, hMemory and size qgpu read
	 * (the status in between too, which the caller has no reason to rewrite).
	 */
	if (checked)
		slot = qgpu_expect(NV_ESC_RM_VID_HEAP_CONTROL, k, VID_HEAP_CHECKED, status_off);
	ret = orig(file, cmd, arg);
	memset(after, 0, sizeof(*after));
	reply = qgpu_expect_done(slot, after, VID_HEAP_ANSWER);
	if (reply == QGPU_REPLY_NONE) {
		settle(&resv);
		kfree(k);
		return ret;
	}
	if (reply == QGPU_REPLY_UNKNOWN && copy_from_user(after, uarg, sizeof(*after)))
		memset(after, 0, sizeof(*after));
	if (freeing && qgpu_rmapi_available()) {
		untrack_if_gone(file, k->hRoot, k->hMemory);
	} else if (freeing) {
		if (!ret && after->status == NV_OK) {
			mutex_lock(&qgpu_lock);
			qgpu_track_free(k->hRoot, k->hMemory);
			mutex_unlock(&qgpu_lock);
		}
	} else if (qgpu_rmapi_available()) {
		pairs[0] = (struct rm_pair){ k->hRoot, k->hMemory };
		pairs[1] = (struct rm_pair){ after->hRoot, after->hMemory };
		learn(file, caller, pairs, 2, &how, &resv, uarg, status_off);
	} else if (!ret && vidmem && after->status == NV_OK) {
		struct rm_fact f = {
			.hclient = k->hRoot,
			.handle = after->hMemory,
			.hclass = NV01_MEMORY_LOCAL_USER,
			.hparent = k->hObjectParent,
		};

		believe(file, caller, &f, asked, &how, &resv);
	}
	settle(&resv);
	kfree(k);
	return ret;
}

/*
 * RM_DUP_OBJECT: a new handle for an existing object (serverCopyResource, resserv's
 * rs_server.c); for memory, another reference to the same memory (memCopyConstruct,
 * src/nvidia/src/kernel/mem_mgr/mem.c), which lives until its last handle is freed. A duplicate
 * that RM confirms (CLIENT_OBJECTS_ARE_DUPLICATES) of tracked memory in the same client shares
 * that memory's charge, which stays on its owner while either lives. A duplicate RM cannot
 * relate to tracked memory (from another client: RM answers that question within one client
 * only) is charged to its holder as memory of its own, and refused past the holder's limit.
 * A duplicate left for RM to name is refused to a configured cgroup (unnamed_refused()), as
 * a handle rule (denied). Without the RM entry nothing can be confirmed: refused to a
 * memory-limited cgroup, by the memory gate (oom, though answered
 * NV_ERR_INSUFFICIENT_PERMISSIONS: the refusal exists only because of the limit).
 */
static long rm_dup(long (*orig)(struct file *, unsigned int, unsigned long), struct file *file,
		   unsigned int cmd, unsigned long arg, void __user *uarg, u32 size)
{
	const unsigned int status_off = offsetof(struct nvos55_params, status);
	u64 caller = qgpu_current_cgroup_id();
	struct nvos55_params k, after;
	struct rm_charge how = { 0 };
	bool have_after, dup, checked;
	enum qgpu_reply reply;
	struct rm_pair pair;
	struct qgpu_cg *cg;
	bool unnamed, limit;
	int slot = -1;
	long ret;
	int i;

	if (size != sizeof(k) || copy_from_user(&k, uarg, sizeof(k)))
		return orig(file, cmd, arg);
	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(caller, false);
	/* Refused: a duplicate RM would name (denied), or any without the RM entry past a limit. */
	unnamed = unnamed_refused(cg, k.hObject, false);
	limit = !unnamed && !qgpu_rmapi_available() && cg && cg->mem_limit;
	if (unnamed)
		cg->denied++;
	else if (limit)
		cg->oom++;
	checked = checked_cg(cg);
	mutex_unlock(&qgpu_lock);
	if (unnamed || limit) {
		answer(uarg, status_off, NV_ERR_INSUFFICIENT_PERMISSIONS);
		qgpu_event(limit ? QGPU_EVENT_OOM : QGPU_EVENT_DENIED, caller, 0);
		return 0;
	}
	/* The handles qgpu read reach RM as they are (a named hObject stays named). */
	if (checked)
		slot = qgpu_expect(NV_ESC_RM_DUP_OBJECT, &k, status_off, status_off);
	ret = orig(file, cmd, arg);
	reply = qgpu_expect_done(slot, &after, sizeof(after));
	if (!qgpu_rmapi_available() || reply == QGPU_REPLY_NONE)
		return ret;
	have_after = reply == QGPU_REPLY_RM || !copy_from_user(&after, uarg, sizeof(after));
	for (i = 0; i < 2; i++) {
		const struct nvos55_params *p = i ? &after : &k;

		if (i && !have_after)
			break;
		pair = (struct rm_pair){ p->hClient, p->hObject };
		/* The source RM confirms this is a duplicate of, among the two copies'. */
		how.dup_of = 0;
		if (p->hObject && k.hClientSrc == p->hClient &&
		    qgpu_rmapi_objects_are_duplicates(p->hClient, p->hObject, k.hObjectSrc,
						      &dup) == NV_OK && dup)
			how.dup_of = k.hObjectSrc;
		else if (p->hObject && have_after && after.hClientSrc == p->hClient &&
			 qgpu_rmapi_objects_are_duplicates(p->hClient, p->hObject,
							   after.hObjectSrc, &dup) == NV_OK && dup)
			how.dup_of = after.hObjectSrc;
		learn(file, caller, &pair, 1, &how, NULL, uarg, status_off);
	}
	return ret;
}

/*
 * Whether freeing @hobject may make RM destroy channels or TSGs that are not below it: RM
 * invalidates an object's dependents with it (serverFreeResourceTree, resserv's rs_server.c), and
 * those of a VA space are the TSGs and context shares made on it, those of a context share the
 * channels that run in it (kchangrpapiConstruct_IMPL, kctxshareapiConstruct_IMPL,
 * kchannelConstruct_IMPL), those of a TSG's graphics context the channels and shares made in the
 * TSG, those of OS-descriptor memory the channels whose USERD it holds
 * (kchannelCreateUserdMemDesc_GV100). A handle qgpu does not track may be one of RM's own: a
 * TSG's graphics context (kchangrpapiConstruct_IMPL) or the two context shares of a TSG in
 * legacy mode (kchangrpapiSetLegacyMode_IMPL), whose handles a tenant can guess. So: an
 * untracked object, a VA space or context share, or memory some channel of the client keeps its
 * USERD in. Nothing else the tenant makes has a TSG or channel as a dependent in 580.142 (every
 * refAddDependant() with one: those above, and a TSG RM made for a channel made outside one,
 * which qgpu does not track), and each free that may costs a control per TSG and channel of the
 * client (untrack_dependents()), where a free of system memory, such as each of libcuda's
 * channels' error notifiers (tools/gpuload/CUDA_SEQUENCE.md), needs none.
 * Context: qgpu_lock held.
 */
static bool frees_dependents(struct qgpu_client *client, u32 hobject)
{
	struct qgpu_obj *obj = qgpu_obj_find(client, hobject), *ch;

	lockdep_assert_held(&qgpu_lock);
	if (!obj || obj->depended_on)
		return true;
	list_for_each_entry(ch, &client->objects, node)
		if (ch->kind == QGPU_OBJ_CHANNEL && ch->userd_mem == hobject && ch != obj)
			return true;
	return false;
}

/*
 * After a free that may have taken dependents with it (frees_dependents()): every TSG and
 * channel qgpu tracks in the client is asked of RM, and those it no longer has working, freed or
 * invalidated (qgpu_rmapi_object_lost()), are forgotten with what is below them. A channel left
 * tracked would be closed and opened in vain every turn (its failure fails the whole
 * FIFO_DISABLE_CHANNELS batch, which sched.c then sends channel by channel), be read as busy
 * from USERD memory that outlives it, and hold its record until the file closes. A record RM
 * confirmed again meanwhile (a handle made again) is kept.
 * Context: no qgpu lock held.
 */
static void untrack_dependents(struct file *file, u32 hclient)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;
	u32 *handles = NULL, cap = 0, n, i;
	bool channel;
	int pass;
	u64 seq;

	for (;;) {
		mutex_lock(&qgpu_lock);
		client = qgpu_client_find(hclient);
		n = 0;
		/* TSGs first: a TSG found gone takes its channels with it. */
		for (pass = 0; client && client->file == file && pass < 2; pass++) {
			list_for_each_entry(obj, &client->objects, node) {
				if (obj->kind != (pass ? QGPU_OBJ_CHANNEL : QGPU_OBJ_TSG))
					continue;
				if (n < cap)
					handles[n] = obj->handle;
				n++;
			}
		}
		if (n <= cap)
			break;
		mutex_unlock(&qgpu_lock);
		kfree(handles);
		handles = kmalloc_array(n, sizeof(*handles), GFP_KERNEL);
		if (!handles)
			return;
		cap = n;
	}
	seq = qgpu_track_seq();
	mutex_unlock(&qgpu_lock);
	for (i = 0; i < n; i++) {
		mutex_lock(&qgpu_lock);
		client = qgpu_client_find(hclient);
		obj = client && client->file == file ? qgpu_obj_find(client, handles[i]) : NULL;
		channel = obj && obj->kind == QGPU_OBJ_CHANNEL;
		mutex_unlock(&qgpu_lock);
		if (!obj || !qgpu_rmapi_object_lost(hclient, handles[i], channel))
			continue;
		mutex_lock(&qgpu_lock);
		client = qgpu_client_find(hclient);
		if (client && client->file == file &&
		    !qgpu_track_added_since(hclient, handles[i], seq))
			qgpu_track_free(hclient, handles[i]);
		mutex_unlock(&qgpu_lock);
	}
	kfree(handles);
}

/*
 * What an RM_FREE freed, as RM confirms it: the client is gone (NV_ERR_INVALID_CLIENT) or the
 * object is (NV_ERR_OBJECT_NOT_FOUND). Only this file's clients are looked at. An allocation in
 * the same client whose account is in flight learns of this free (qgpu_track_freeing()); if RM
 * confirmed what this would drop while it asked (a handle made again), RM is asked again, and
 * the record is kept if that goes on (charged too long rather than not at all). What RM freed
 * with it as its dependents is looked for after (untrack_dependents()).
 * Context: no qgpu lock held.
 */
static void untrack_if_gone(struct file *file, u32 hclient, u32 hobject)
{
	bool whole = hobject == hclient || !hobject;
	struct qgpu_client *client;
	bool known, dependents;
	u32 status, cls;
	int tries;
	u64 seq;

	mutex_lock(&qgpu_lock);
	seq = qgpu_track_freeing(file, hclient, whole);
	client = qgpu_client_find(hclient);
	known = client && client->file == file && (whole || qgpu_obj_find(client, hobject));
	dependents = client && client->file == file && !whole && frees_dependents(client, hobject);
	mutex_unlock(&qgpu_lock);
	for (tries = 1; known; tries++) {
		status = qgpu_rmapi_handle_info(hclient, whole ? hclient : hobject,
						NV0000_HANDLE_INFO_INDEX_CLASSID, &cls);
		if (status != NV_ERR_INVALID_CLIENT &&
		    (whole || status != NV_ERR_OBJECT_NOT_FOUND))
			break;
		mutex_lock(&qgpu_lock);
		if (!qgpu_track_added_since(hclient, hobject, seq)) {
			client = qgpu_client_find(hclient);
			if (client && client->file == file)
				qgpu_track_free(hclient, hobject);
			mutex_unlock(&qgpu_lock);
			break;
		}
		seq = qgpu_track_seq();
		mutex_unlock(&qgpu_lock);
		if (tries >= ACCOUNT_TRIES)
			break;
	}
	if (dependents)
		untrack_dependents(file, hclient);
}

static long rm_free(long (*orig)(struct file *, unsigned int, unsigned long), struct file *file,
		    unsigned int cmd, unsigned long arg, void __user *uarg, u32 size)
{
	const unsigned int status_off = offsetof(struct nvos00_params, status);
	u64 caller = qgpu_current_cgroup_id();
	struct nvos00_params k, after;
	bool have_after, checked;
	enum qgpu_reply reply;
	int slot = -1;
	long ret;

	if (size != sizeof(k) || copy_from_user(&k, uarg, sizeof(k)))
		return orig(file, cmd, arg);
	/* RM tears down its mappings of what it frees: qgpu stops reading them first. */
	mutex_lock(&qgpu_lock);
	qgpu_userd_forget(k.hRoot, k.hObjectOld);
	checked = checked_cg(qgpu_cg_get(caller, false));
	mutex_unlock(&qgpu_lock);
	/* RM frees what qgpu stopped reading, or nothing. */
	if (checked)
		slot = qgpu_expect(NV_ESC_RM_FREE, &k, status_off, status_off);
	ret = orig(file, cmd, arg);
	reply = qgpu_expect_done(slot, &after, sizeof(after));
	if (reply == QGPU_REPLY_NONE)
		return ret;
	have_after = reply == QGPU_REPLY_RM || !copy_from_user(&after, uarg, sizeof(after));
	if (qgpu_rmapi_available()) {
		untrack_if_gone(file, k.hRoot, k.hObjectOld);
		if (have_after && (after.hRoot != k.hRoot || after.hObjectOld != k.hObjectOld))
			untrack_if_gone(file, after.hRoot, after.hObjectOld);
	} else if (!ret && have_after && after.status == NV_OK) {
		/* Without the RM entry: qgpu's own copy, on the status written back. */
		mutex_lock(&qgpu_lock);
		qgpu_track_free(k.hRoot, k.hObjectOld);
		mutex_unlock(&qgpu_lock);
	}
	return ret;
}

/*
 * Exports an RM object can be handed to another process with (ctrl0000unix.h): the exported
 * object is duplicated into RM's own export client (RmExportObject in src/nvidia/arch/nvalloc/
 * unix/src/rmobjexportimport.c), where it lives as long as the fd does, out of every tenant's
 * client and so out of qgpu's sight; an import duplicates it into the importer's client. Both
 * are refused to a memory-limited cgroup (memory_verdict()); so is NV_ESC_EXPORT_TO_DMABUF_FD.
 */
static bool memory_export_control(u32 cmd)
{
	switch (cmd) {
	case NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD:
	case NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD:
	case NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD:
	case NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD:
		return true;
	}
	return false;
}

/*
 * Whether the calling process's cgroup has a memory limit; when it has, the caller refuses the
 * export, and the refusal is the memory gate's: counted as oom with QGPU_EVENT_OOM, though the
 * tenant is answered NV_ERR_INSUFFICIENT_PERMISSIONS or -EPERM (the memory would be held where
 * qgpu cannot charge it, and only a limit makes that matter).
 */
static bool memory_limited(u64 id)
{
	if (!qgpu_gate_limited(id))
		return false;
	qgpu_gate_refused(id);
	return true;
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
 * is, so that request is carried out, by qgpu's RM client as qgpu read it (mode_by_qgpu()); any
 * other mode (WFI or CTA, or a graphics mode) would let the context run on longer once qgpu's
 * slice is over, and is refused. A compute mode RM carried out becomes the context's own, which
 * qgpu restores where it set CTA (timeslice.c), gated or not, and qgpu sets its CTA again after
 * it. Everything else in qgpu_scheduling_control() is refused: interleave levels, realtime
 * TSGs, runlist restarts and policies, stopping channels, preempting and disabling.
 */
enum verdict { PASS, SWALLOW, REFUSE };

/* A preemption request's parameters, read once; false where they cannot be. */
static bool read_mode(const struct nvos54_params *p,
		      struct nv2080_ctxsw_preemption_mode_params *mode)
{
	return p->cmd == NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE &&
	       p->paramsSize == sizeof(*mode) &&
	       !copy_from_user(mode, u64_to_user_ptr(p->params), sizeof(*mode));
}

static enum verdict preemption_verdict(const struct nv2080_ctxsw_preemption_mode_params *mode)
{
	if (mode && mode->flags == NV2080_CTXSW_PREEMPTION_FLAG_CILP &&
	    mode->cilpPreemptMode == NV2080_CTXSW_PREEMPTION_COMPUTE_CILP)
		return PASS;
	return REFUSE;
}

static enum verdict tenant_verdict(const struct nvos54_params *p,
				   const struct nv2080_ctxsw_preemption_mode_params *mode)
{
	u8 enable;

	switch (p->cmd) {
	case NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
	case NVA06F_CTRL_CMD_GPFIFO_SCHEDULE:
		/*
		 * RM reads bEnable again from the tenant's memory (the parameter block is not
		 * compared): a tenant that makes it a disable in time reaches only its own
		 * channels, and a disable had no effect on an H200 (h200-findings.md §2).
		 */
		if (p->paramsSize < 1 || copy_from_user(&enable, u64_to_user_ptr(p->params), 1))
			return REFUSE;
		return enable ? PASS : REFUSE;
	case NVA06C_CTRL_CMD_SET_TIMESLICE:
		return SWALLOW;
	case NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE:
		return preemption_verdict(mode);
	default:
		return REFUSE;
	}
}

/*
 * A tenant's SET_TIMESLICE that RM carried out: the TSG's own from now on, and whatever qgpu had
 * set there is gone (a request sent just before its cgroup was configured can land after qgpu's).
 */
static bool carried_out(void __user *uarg, enum qgpu_reply reply,
			const struct nvos54_params *answered)
{
	u32 __user *ustatus = (u32 __user *)((u8 __user *)uarg +
					     offsetof(struct nvos54_params, status));
	u32 status;

	/* RM's status where the driver's copy was kept; else the caller's memory says. */
	if (reply == QGPU_REPLY_RM)
		status = answered->status;
	else if (reply == QGPU_REPLY_NONE || get_user(status, ustatus))
		return false;
	return status == NV_OK;
}

static void timeslice_carried_out(struct file *file, void __user *uarg,
				  const struct nvos54_params *p, u64 us, enum qgpu_reply reply,
				  const struct nvos54_params *answered)
{
	bool tracked;

	if (!carried_out(uarg, reply, answered))
		return;
	mutex_lock(&qgpu_lock);
	tracked = qgpu_timeslice_tenant(file, p->hClient, p->hObject, us, true);
	mutex_unlock(&qgpu_lock);
	if (tracked)
		qgpu_timeslice_kick();
}

/* A tenant's compute preemption mode that RM carried out: the context's own from now on. */
static void mode_carried_out(struct file *file, void __user *uarg,
			     const struct nvos54_params *p,
			     const struct nv2080_ctxsw_preemption_mode_params *mode,
			     enum qgpu_reply reply, const struct nvos54_params *answered)
{
	bool tracked;

	if (!(mode->flags & NV2080_CTXSW_PREEMPTION_FLAG_CILP) ||
	    !carried_out(uarg, reply, answered))
		return;
	mutex_lock(&qgpu_lock);
	tracked = qgpu_timeslice_tenant_mode(file, p->hClient, mode->hChannel,
					     mode->cilpPreemptMode);
	mutex_unlock(&qgpu_lock);
	if (tracked)
		qgpu_timeslice_kick();
}

/*
 * A gated tenant's compute preemption request that the guard lets through (CILP), carried out
 * by qgpu's RM client with the parameters qgpu read instead of being passed on: RM copies the
 * parameter block in from the tenant's memory after qgpu's read (rmapiParamsAcquire,
 * param_copy.c), where a tenant thread could have made it a coarser mode by then, and the
 * driver's probe compares only the request (rmprobe.c). The same control on the same client
 * and subdevice, the CILP flag alone, as CUDA sends it; the tenant gets RM's status. Only for a
 * client of this file that qgpu tracks (the kernel client reaches any client, RM does not
 * check whose it is): false for any other, whose request is passed on as read.
 */
static bool mode_by_qgpu(struct file *file, void __user *uarg, const struct nvos54_params *p,
			 const struct nv2080_ctxsw_preemption_mode_params *mode)
{
	struct qgpu_client *client;
	bool ours, tracked = false;
	u32 status;

	if (!qgpu_rmapi_available())
		return false;
	mutex_lock(&qgpu_lock);
	client = qgpu_client_find(p->hClient);
	ours = client && client->file == file;
	mutex_unlock(&qgpu_lock);
	if (!ours)
		return false;
	status = qgpu_rmapi_set_compute_preemption(p->hClient, p->hObject, mode->hChannel,
						   mode->cilpPreemptMode);
	if (status == NV_OK) {
		mutex_lock(&qgpu_lock);
		tracked = qgpu_timeslice_tenant_mode(file, p->hClient, mode->hChannel,
						     mode->cilpPreemptMode);
		mutex_unlock(&qgpu_lock);
	}
	answer(uarg, offsetof(struct nvos54_params, status), status);
	if (tracked)
		qgpu_timeslice_kick();
	return true;
}

/*
 * A failed IMPORT_OBJECTS_FROM_FD frees, inside RM and with no RM_FREE for qgpu to see, every
 * non-zero handle of objects[] before the failing slot: what it imported, and also an object of
 * the caller's own named for a slot with nothing in it (os.c in src/nvidia/arch/nvalloc/unix/src:
 * cliresCtrlCmdOsUnixImportObjectsFromFd_IMPL). After the call qgpu asks RM about each handle
 * of its one copy and lets go of what RM no longer has (untrack_if_gone()). A tenant that
 * rewrites objects[] before RM reads it leaves a record of something freed: charged too long,
 * not missed.
 */
static long rm_import_objects(long (*orig)(struct file *, unsigned int, unsigned long),
			      struct file *file, unsigned int cmd, unsigned long arg,
			      const struct nvos54_params *p)
{
	struct nv0000_import_objects_from_fd_params *k;
	unsigned int i, n;
	long ret;

	if (!qgpu_rmapi_available() || p->paramsSize != sizeof(*k))
		return orig(file, cmd, arg);
	k = kmalloc(sizeof(*k), GFP_KERNEL);
	if (!k)
		return orig(file, cmd, arg);
	if (copy_from_user(k, u64_to_user_ptr(p->params), sizeof(*k))) {
		kfree(k);
		return orig(file, cmd, arg);
	}
	ret = orig(file, cmd, arg);
	n = min_t(unsigned int, k->numObjects, ARRAY_SIZE(k->objects));
	for (i = 0; i < n; i++)
		if (k->objects[i])
			untrack_if_gone(file, p->hClient, k->objects[i]);
	kfree(k);
	return ret;
}

/*
 * An RM_CONTROL qgpu lets through, held to what qgpu read where @checked (its caller's cgroup
 * is configured or memory-limited: rmprobe.c): a command, object or parameter block rewritten
 * after qgpu's read reaches RM refused. Where @answered is given, it gets RM's answer from the
 * driver's copy, and the reply says whether it did (qgpu_expect_done()).
 */
static long passed_as_read(long (*orig)(struct file *, unsigned int, unsigned long),
			   struct file *file, unsigned int cmd, unsigned long arg,
			   const struct nvos54_params *p, bool checked,
			   struct nvos54_params *answered, enum qgpu_reply *reply)
{
	enum qgpu_reply got;
	int slot = -1;
	long ret;

	if (checked)
		slot = qgpu_expect(NV_ESC_RM_CONTROL, p, offsetof(struct nvos54_params, status),
				   offsetof(struct nvos54_params, status));
	ret = orig(file, cmd, arg);
	got = qgpu_expect_done(slot, answered, answered ? sizeof(*answered) : 0);
	if (reply)
		*reply = got;
	return ret;
}

static long rm_control(long (*orig)(struct file *, unsigned int, unsigned long),
		       struct file *file, unsigned int cmd, unsigned long arg, void __user *uarg,
		       u32 size)
{
	struct nv2080_ctxsw_preemption_mode_params mode;
	struct nvos54_params p, answered;
	enum qgpu_reply reply;
	enum verdict verdict;
	bool gated, checked, timeslice, preemption;
	struct qgpu_cg *cg;
	u64 id, us = 0;
	long ret;

	if (size != sizeof(p) || copy_from_user(&p, uarg, sizeof(p)))
		return orig(file, cmd, arg);
	if (memory_export_control(p.cmd)) {
		if (memory_limited(qgpu_current_cgroup_id())) {
			answer(uarg, offsetof(struct nvos54_params, status),
			       NV_ERR_INSUFFICIENT_PERMISSIONS);
			return 0;
		}
		if (p.cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD)
			return rm_import_objects(orig, file, cmd, arg, &p);
		return orig(file, cmd, arg);
	}
	id = qgpu_current_cgroup_id();
	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(id, false);
	gated = cg && cg->configured;
	checked = checked_cg(cg);
	mutex_unlock(&qgpu_lock);
	if (!qgpu_scheduling_control(p.cmd))
		return passed_as_read(orig, file, cmd, arg, &p, checked, NULL, NULL);
	/* A timeslice request's value, read once: the TSG's own from now on (timeslice.c). */
	timeslice = p.cmd == NVA06C_CTRL_CMD_SET_TIMESLICE &&
		    p.paramsSize == sizeof(struct nva06c_timeslice_params) &&
		    !copy_from_user(&us, u64_to_user_ptr(p.params), sizeof(us));
	/* A compute preemption request's, likewise: its context's own once carried out. */
	preemption = read_mode(&p, &mode);
	verdict = gated ? tenant_verdict(&p, preemption ? &mode : NULL) : PASS;
	if (verdict == PASS && gated && preemption && mode_by_qgpu(file, uarg, &p, &mode))
		return 0;
	if (verdict == PASS) {
		ret = passed_as_read(orig, file, cmd, arg, &p, checked, &answered, &reply);
		if (timeslice && !ret)
			timeslice_carried_out(file, uarg, &p, us, reply, &answered);
		if (preemption && !ret)
			mode_carried_out(file, uarg, &p, &mode, reply, &answered);
		return ret;
	}
	mutex_lock(&qgpu_lock);
	cg = qgpu_cg_get(id, false);
	/* The tenant guard's, not the memory gate's: denied, swallowed or refused. */
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

/*
 * RM_MAP_MEMORY: RM maps the memory object for the file the request names by fd, and the next
 * mmap of that file maps it (rm_create_mmap_context, escape.c); qgpu notes the mapping on that
 * file, to know a channel's USERD when it is mmapped (userd.c). Where the caller's cgroup (or
 * the client's) is checked, the request reaches RM only as qgpu read it, and the facts of the
 * mapping (file, address, status) are RM's answer from the driver's copy: a tenant thread that
 * rewrites fd or pLinearAddress in its buffer once the driver copied the answer out would have
 * qgpu note the mapping on another file, and leave the tenant's own channels blind.
 */
static long rm_map_memory(long (*orig)(struct file *, unsigned int, unsigned long),
			  struct file *file, unsigned int cmd, unsigned long arg,
			  void __user *uarg, u32 size)
{
	const unsigned int status_off = offsetof(struct nvos33_params_with_fd, status);
	u64 caller = qgpu_current_cgroup_id();
	struct nvos33_params_with_fd k, p;
	struct qgpu_client *client;
	enum qgpu_reply reply;
	struct file *target;
	int slot = -1;
	bool checked;
	long ret;

	if (size != sizeof(k) || copy_from_user(&k, uarg, sizeof(k)))
		return orig(file, cmd, arg);
	mutex_lock(&qgpu_lock);
	client = qgpu_client_find(k.hClient);
	checked = checked_cg(qgpu_cg_get(caller, false)) || (client && checked_cg(client->cg));
	mutex_unlock(&qgpu_lock);
	/* All of it: RM reads every field but the status, and writes its answer over them. */
	if (checked)
		slot = qgpu_expect(NV_ESC_RM_MAP_MEMORY, &k, sizeof(k), status_off);
	ret = orig(file, cmd, arg);
	/* The file RM left the mapping on; else found by the answer's fd number, as before. */
	target = qgpu_expect_file(slot);
	reply = qgpu_expect_done(slot, &p, sizeof(p));
	if (reply == QGPU_REPLY_NONE)
		goto out;
	/* Without the driver's answer (unchecked, or not kept): the caller's memory, as before. */
	if (reply == QGPU_REPLY_UNKNOWN && copy_from_user(&p, uarg, sizeof(p)))
		goto out;
	if (ret || p.status != NV_OK)
		goto out;
	if (!target)
		target = fget(p.fd);
	if (!target)
		return ret;
	mutex_lock(&qgpu_lock);
	qgpu_track_mapping(target, &p);
	mutex_unlock(&qgpu_lock);
out:
	if (target)
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

/**
 * qgpu_ioctl() - the hook around the driver's unlocked_ioctl on /dev/nvidia*
 * @orig: the driver's own handler, which every call reaches unless qgpu answers it
 * @file: the device file
 * @cmd: the request (NVIDIA's escapes have type NVRM_IOCTL_MAGIC; others pass untouched)
 * @arg: the caller's argument, a user pointer
 *
 * Gates memory, tracks objects and guards scheduling controls for the escapes qgpu follows
 * (see the comment at the top of this file); a refusal is answered in the argument's status,
 * as the driver answers, with 0 returned.
 *
 * Context: process context, no qgpu lock held; may sleep.
 * Return: what @orig returned, 0 for a call qgpu answered itself, or a negative errno.
 */
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
	case NV_ESC_RM_VID_HEAP_CONTROL:
		return rm_vid_heap(orig, file, cmd, arg, uarg, size);
	case NV_ESC_RM_DUP_OBJECT:
		return rm_dup(orig, file, cmd, arg, uarg, size);
	case NV_ESC_EXPORT_TO_DMABUF_FD:
		/* A dma-buf holds the memory past every tenant handle (nv-dmabuf.c). */
		if (memory_limited(qgpu_current_cgroup_id()))
			return -EPERM;
		return orig(file, cmd, arg);
	default:
		return orig(file, cmd, arg);
	}
}

/**
 * qgpu_mmap() - the hook around the driver's mmap on /dev/nvidia*
 * @orig: the driver's own handler, called first
 * @file: the device file
 * @vma: the mapping being made
 *
 * A mapping the driver made may hold channels' USERD, which the scheduler reads (userd.c).
 *
 * Context: process context, mmap_lock held by the caller; takes qgpu_lock.
 * Return: what @orig returned.
 */
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

/**
 * qgpu_release() - the hook around the driver's release of /dev/nvidia*
 * @orig: the driver's own handler, which frees the clients living on @file
 * @inode: the device inode
 * @file: the file going away
 *
 * USERD mapped through @file stops being read before the driver tears it down; what the driver
 * freed is forgotten after.
 *
 * Context: process context, no qgpu lock held.
 * Return: what @orig returned.
 */
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
