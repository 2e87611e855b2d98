// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: RM clients and the objects under them (RM_ALLOC, RM_FREE).
 *
 * A client owns a tree of objects named by 32-bit handles; freeing an object frees its subtree,
 * freeing the client frees everything, and closing the file a client was allocated through frees
 * the client. Answers follow RM: the ioctl succeeds and the status says what happened.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/log2.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "nvmock.h"

atomic_t nvmock_counts[NVMOCK_KINDS];

static DEFINE_XARRAY(clients);
static LIST_HEAD(client_list);
static u32 next_client_handle;

#define BIT_KIND(k) (1u << (k))

struct class_desc {
	u32 hclass;
	enum nvmock_kind kind;
	u32 params_size;
	bool params_required;
	u32 parents;		/* kinds a parent may be */
};

static const struct class_desc class_table[] = {
	{ NV01_ROOT, NVMOCK_CLIENT, 0, false, 0 },
	{ NV01_ROOT_NON_PRIV, NVMOCK_CLIENT, 0, false, 0 },
	{ NV01_ROOT_CLIENT, NVMOCK_CLIENT, 0, false, 0 },
	{ NV01_DEVICE_0, NVMOCK_DEVICE, sizeof(struct nv0080_alloc_params), false,
	  BIT_KIND(NVMOCK_CLIENT) },
	{ NV20_SUBDEVICE_0, NVMOCK_SUBDEVICE, sizeof(struct nv2080_alloc_params), false,
	  BIT_KIND(NVMOCK_DEVICE) },
	{ HOPPER_USERMODE_A, NVMOCK_USERMODE, 2, false, BIT_KIND(NVMOCK_SUBDEVICE) },
	{ FERMI_VASPACE_A, NVMOCK_VASPACE, 56, true,
	  BIT_KIND(NVMOCK_DEVICE) | BIT_KIND(NVMOCK_SUBDEVICE) },
	{ FERMI_CONTEXT_SHARE_A, NVMOCK_CTXSHARE, sizeof(struct nv_ctxshare_alloc_params), true,
	  BIT_KIND(NVMOCK_TSG) },
	{ KEPLER_CHANNEL_GROUP_A, NVMOCK_TSG, sizeof(struct nv_channel_group_alloc_params), true,
	  BIT_KIND(NVMOCK_DEVICE) },
	{ AMPERE_CHANNEL_GPFIFO_A, NVMOCK_CHANNEL, sizeof(struct nv_channel_alloc_params), true,
	  BIT_KIND(NVMOCK_DEVICE) | BIT_KIND(NVMOCK_TSG) },
	{ HOPPER_CHANNEL_GPFIFO_A, NVMOCK_CHANNEL, sizeof(struct nv_channel_alloc_params), true,
	  BIT_KIND(NVMOCK_DEVICE) | BIT_KIND(NVMOCK_TSG) },
	{ HOPPER_COMPUTE_A, NVMOCK_COMPUTE, 16, false, BIT_KIND(NVMOCK_CHANNEL) },
	{ HOPPER_DMA_COPY_A, NVMOCK_COPY, 8, false, BIT_KIND(NVMOCK_CHANNEL) },
	{ NV01_MEMORY_SYSTEM, NVMOCK_SYSMEM, sizeof(struct nv_memory_alloc_params), true,
	  BIT_KIND(NVMOCK_DEVICE) },
	{ NV01_MEMORY_LOCAL_USER, NVMOCK_VIDMEM, sizeof(struct nv_memory_alloc_params), true,
	  BIT_KIND(NVMOCK_DEVICE) | BIT_KIND(NVMOCK_SUBDEVICE) },
};

static const char *const kind_names[NVMOCK_KINDS] = {
	[NVMOCK_CLIENT] = "clients",
	[NVMOCK_DEVICE] = "devices",
	[NVMOCK_SUBDEVICE] = "subdevices",
	[NVMOCK_USERMODE] = "usermode",
	[NVMOCK_VASPACE] = "vaspaces",
	[NVMOCK_CTXSHARE] = "ctxshares",
	[NVMOCK_TSG] = "tsgs",
	[NVMOCK_CHANNEL] = "channels",
	[NVMOCK_COMPUTE] = "compute",
	[NVMOCK_COPY] = "copy",
	[NVMOCK_SYSMEM] = "sysmem",
	[NVMOCK_VIDMEM] = "vidmem",
	[NVMOCK_GRCTX] = "grctxs",
	[NVMOCK_INVALID] = "invalid",
};

const char *nvmock_kind_name(enum nvmock_kind kind)
{
	return kind < NVMOCK_KINDS ? kind_names[kind] : "?";
}

static const struct class_desc *class_of(u32 hclass)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(class_table); i++)
		if (class_table[i].hclass == hclass)
			return &class_table[i];
	return NULL;
}

/* The kind of object a class makes (class_table), NVMOCK_KINDS for a class nvmock lacks. */
enum nvmock_kind nvmock_class_kind(u32 hclass)
{
	const struct class_desc *desc = class_of(hclass);

	return desc ? desc->kind : NVMOCK_KINDS;
}

struct nvmock_client *nvmock_client_get(u32 handle)
{
	return xa_load(&clients, handle);
}

struct nvmock_object *nvmock_object_get(struct nvmock_client *client, u32 handle)
{
	if (handle == client->handle)
		return &client->root;
	return xa_load(&client->objects, handle);
}

/* A client is reachable through the file it was allocated through; the kernel reaches any. */
u32 nvmock_caller_client(const struct nvmock_caller *caller, u32 hclient,
			 struct nvmock_client **client)
{
	struct nvmock_client *found = nvmock_client_get(hclient);

	if (!found || (!caller->kernel && found->owner != caller->file))
		return NV_ERR_INVALID_CLIENT;
	*client = found;
	return NV_OK;
}

/*
 * The client of RM_ALLOC, RM_FREE and RM_DUP_OBJECT, as resserv looks it up: one that does not
 * exist is NV_ERR_INVALID_OBJECT_HANDLE (_serverLockClientWithLockInfo, rs_server.c), one of
 * another file NV_ERR_INVALID_CLIENT (clientValidate). Controls answer NV_ERR_INVALID_CLIENT to
 * both (nvmock_caller_client()). Measured on an H100 (580.159.04): tests/vm/rmcases.py
 * clients_not_ones_own and frees, tools/gpu/results/2026-11-26-rm-conformance-h100.json.
 */
static u32 object_call_client(const struct nvmock_caller *caller, u32 hclient,
			      struct nvmock_client **client)
{
	if (!nvmock_client_get(hclient))
		return NV_ERR_INVALID_OBJECT_HANDLE;
	return nvmock_caller_client(caller, hclient, client);
}

/* -- constructors and destructors ------------------------------------------------------------ */

static u32 device_construct(const struct nvmock_caller *caller, struct nvmock_object *obj,
			    const void *params)
{
	const struct nv0080_alloc_params *p = params;
	u32 index = p ? p->deviceId : 0;

	/* deviceConstruct (gpu/device.c): gpumgrIsDeviceInstanceValid fails. */
	if (index >= nvmock_num_gpus)
		return NV_ERR_INVALID_CLASS;
	if (!caller->kernel && !nvmock_process_has_gpu_open(index))
		return NV_ERR_INSUFFICIENT_PERMISSIONS;
	obj->gpu = &nvmock_gpus[index];
	return NV_OK;
}

/*
 * subdeviceConstruct (src/nvidia/src/kernel/gpu/subdevice/subdevice.c): an instance past
 * NV2080_MAX_SUBDEVICES is NV_ERR_INVALID_CLASS (gpumgrIsSubDeviceInstanceValid); a device of one
 * GPU, which every nvmock device is, finds that GPU for any other instance
 * (gpugrpGetGpuFromSubDeviceInstance, gpu_group.c); a second subdevice of the same instance under
 * one device is NV_ERR_INSUFFICIENT_RESOURCES. Measured on an H100 (580.159.04): instance 1 NV_OK
 * beside instance 0, instance 0 again refused so (tests/vm/rmcases.py object_handles).
 */
static u32 subdevice_construct(struct nvmock_object *obj, const void *params)
{
	const struct nv2080_alloc_params *p = params;
	u32 instance = p ? p->subDeviceId : 0;
	struct nvmock_object *sibling;

	if (instance >= NV2080_MAX_SUBDEVICES)
		return NV_ERR_INVALID_CLASS;
	list_for_each_entry(sibling, &obj->parent->children, sibling)
		if (sibling->kind == NVMOCK_SUBDEVICE && sibling->subdevice_instance == instance)
			return NV_ERR_INSUFFICIENT_RESOURCES;
	obj->subdevice_instance = instance;
	return NV_OK;
}

/*
 * NV_HOPPER_USERMODE_A_PARAMS: bBar1Mapping, bPriv. usrmodeConstruct_IMPL
 * (src/nvidia/src/kernel/gpu/fifo/usermode_api.c) refuses the privileged window without a BAR1
 * mapping to any caller (NV_ERR_INVALID_PARAMETER), then to a caller below kernel privilege
 * (NV_ERR_INSUFFICIENT_PERMISSIONS). Measured on an H100 (rmcases.py alloc_refusal_order).
 */
static u32 usermode_construct(const struct nvmock_caller *caller, const u8 *params)
{
	if (params && params[1] && !params[0])
		return NV_ERR_INVALID_PARAMETER;
	if (params && params[1] && !caller->kernel)
		return NV_ERR_INSUFFICIENT_PERMISSIONS;
	return NV_OK;
}

/*
 * The subcontexts of a TSG: RM's heap of them holds kfifoChannelGroupGetLocalMaxSubcontext_HAL
 * IDs (kchangrpInit_IMPL, kernel_channel_group.c), 64 on an H100 (the first ASYNC share got 63,
 * rmcases.py context_shares, call 48B) and on an H200 (libcuda's got 63, the H200 trace's line
 * 2485). Hopper's lower bound for PREFER_LOWER is the same 64 (kfifoGetMaxLowerSubcontext_35972f,
 * g_kernel_fifo_nvoc.h), so its bit 31 is always set. In legacy mode
 * the heap holds 2 (kfifoGetMaxSubcontext_GV100, arch/volta/kernel_fifo_gv100.c).
 */
#define SUBCTX_MAX	64
#define SUBCTX_LEGACY	2

static struct nvmock_tsg *tsg_create(struct nvmock_gpu *gpu, pid_t tgid)
{
	struct nvmock_tsg *tsg = kzalloc(sizeof(*tsg), GFP_KERNEL);
	int id;

	if (!tsg)
		return NULL;
	id = ida_alloc_max(&gpu->tsg_ids, 4095, GFP_KERNEL);
	if (id < 0) {
		kfree(tsg);
		return NULL;
	}
	tsg->gpu = gpu;
	tsg->id = id;
	tsg->tgid = tgid;
	tsg->timeslice_us = NVRM_DEFAULT_TIMESLICE_US;
	tsg->subctx_max = SUBCTX_MAX;
	/* What the GPUs answered for every context read (subdevice_get_ctxsw_modes()). */
	tsg->compute_preemption = NV2080_CTXSW_PREEMPTION_COMPUTE_CILP;
	INIT_LIST_HEAD(&tsg->channels);
	nvmock_engine_add_tsg(tsg);
	return tsg;
}

static void tsg_destroy(struct nvmock_tsg *tsg)
{
	nvmock_engine_remove_tsg(tsg);
	ida_free(&tsg->gpu->tsg_ids, tsg->id);
	kfree(tsg);
}

static u32 pick_handle(struct nvmock_client *client, u32 *hnew);
static struct nvmock_object *object_new(struct nvmock_client *client,
					struct nvmock_object *parent, u32 handle, u32 hclass,
					enum nvmock_kind kind);
static void object_attach(struct nvmock_object *obj);
static void object_discard(struct nvmock_object *obj);

/*
 * An object RM makes itself in a client (an allocation with a zero handle, from inside another):
 * at the next handle RM would give, under @parent, not yet constructed (the caller does, then
 * object_attach()). NULL with *status set where no handle or memory is left.
 */
static struct nvmock_object *rm_made(struct nvmock_object *parent, u32 hclass,
				     enum nvmock_kind kind, u32 *status)
{
	struct nvmock_object *obj;
	u32 handle = 0;

	*status = pick_handle(parent->client, &handle);
	if (*status != NV_OK)
		return NULL;
	obj = object_new(parent->client, parent, handle, hclass, kind);
	if (!obj)
		*status = NV_ERR_NO_MEMORY;
	return obj;
}

/*
 * The graphics context of a TSG's client that RM looks up (NULL where the client freed it): a
 * channel or context share made in the TSG is its dependent.
 */
static struct nvmock_object *grctx_of(struct nvmock_object *tsg_obj)
{
	struct nvmock_object *obj = nvmock_object_get(tsg_obj->client, tsg_obj->tsg->grctx);

	return obj && obj->kind == NVMOCK_GRCTX ? obj : NULL;
}

/* The VA space a handle names in the client, or NULL. */
static struct nvmock_object *vaspace_of(struct nvmock_client *client, u32 handle)
{
	struct nvmock_object *obj = handle ? nvmock_object_get(client, handle) : NULL;

	return obj && obj->kind == NVMOCK_VASPACE ? obj : NULL;
}

/*
 * KEPLER_CHANNEL_GROUP_A: kchangrpapiConstruct_IMPL (kernel_channel_group_api.c), on a GPU with
 * a channel RAM per runlist (Hopper), refuses an engine type that is not valid
 * (NV_ERR_INVALID_ARGUMENT, RM_ENGINE_TYPE_IS_VALID): the TSG's runlist comes from it, and its
 * channels must be of it (channel_share()). A VA space named makes the TSG its dependent
 * (refAddDependant): freeing the VA space frees the TSG with everything under it. Without MIG,
 * RM then makes the TSG's graphics context (KERNEL_GRAPHICS_CONTEXT, RS_FLAGS_INTERNAL_ONLY in
 * resource_list.h) as an object of the client under the TSG, at the next handle it would give;
 * the channels and context shares made in the TSG depend on it (kchannelConstruct_IMPL,
 * kctxshareapiConstruct_IMPL).
 */
static u32 tsg_construct(struct nvmock_object *obj, const struct nv_channel_group_alloc_params *p)
{
	struct nvmock_object *grctx;
	u32 status;

	if (!p->engineType || p->engineType >= NV2080_ENGINE_TYPE_LAST)
		return NV_ERR_INVALID_ARGUMENT;
	obj->tsg = tsg_create(obj->gpu, obj->client->tgid);
	if (!obj->tsg)
		return NV_ERR_NO_MEMORY;
	obj->tsg->engine_type = p->engineType;
	obj->dep[0] = vaspace_of(obj->client, p->hVASpace);
	grctx = rm_made(obj, KERNEL_GRAPHICS_CONTEXT, NVMOCK_GRCTX, &status);
	if (!grctx) {
		tsg_destroy(obj->tsg);
		obj->tsg = NULL;
		return status;
	}
	object_attach(grctx);
	obj->tsg->grctx = grctx->handle;
	return NV_OK;
}

/*
 * A context share's subcontext (VEID), as kctxshareInitCommon_IMPL (kernel_ctxshare.c) takes it
 * from its TSG's heap, by flags compared whole: SYNC VEID 0; ASYNC the highest free one (the heap
 * grows down, so 0 once 1..63 are taken); PREFER_LOWER the lowest free from 1, else 0; SPECIFIED
 * subctxId. A VEID taken or out of the heap is NV_ERR_NO_MEMORY (the heap's refusal), other
 * flags NV_ERR_INVALID_ARGUMENT; the ID is written back into subctxId. Measured on an H100
 * (rmcases.py context_shares): 63, 62, then SYNC 0 and again NV_ERR_NO_MEMORY, SPECIFIED 5 and
 * again NV_ERR_NO_MEMORY, 64 NV_ERR_NO_MEMORY, PREFER_LOWER 0x80000001 and 0x80000002, flags 4
 * NV_ERR_INVALID_ARGUMENT, and 63 again once its share was freed. A VA space named and the TSG's
 * graphics context make the share their dependent (kctxshareapiConstruct_IMPL:
 * refAddDependant), freed with either; with the graphics context freed the share is
 * NV_ERR_OBJECT_NOT_FOUND (its lookup, after the heap's). In a TSG in
 * legacy mode (channel_share()) the heap holds 2 IDs, both RM's own shares': any other share
 * there is NV_ERR_NO_MEMORY.
 */
static u32 ctxshare_construct(struct nvmock_object *obj, struct nv_ctxshare_alloc_params *p)
{
	struct nvmock_tsg *tsg = obj->parent->tsg;
	struct nvmock_object *grctx;
	u64 taken = tsg->subctx_ids | ~GENMASK_ULL(tsg->subctx_max - 1, 0);
	u64 above_0 = ~taken & ~BIT_ULL(0);
	u32 id;

	switch (p->flags) {
	case NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_SYNC:
		id = 0;
		break;
	case NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC:
		if (~taken == 0)
			return NV_ERR_NO_MEMORY;
		id = fls64(~taken) - 1;
		break;
	case NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC_PREFER_LOWER:
		id = above_0 ? __ffs64(above_0) : 0;
		break;
	case NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_SPECIFIED:
		if (p->subctxId >= tsg->subctx_max)
			return NV_ERR_NO_MEMORY;
		id = p->subctxId;
		break;
	default:
		return NV_ERR_INVALID_ARGUMENT;
	}
	if (taken & BIT_ULL(id))
		return NV_ERR_NO_MEMORY;
	grctx = grctx_of(obj->parent);
	if (!grctx)
		return NV_ERR_OBJECT_NOT_FOUND;
	tsg->subctx_ids |= BIT_ULL(id);
	obj->subctx_id = id;
	obj->dep[0] = vaspace_of(obj->client, p->hVASpace);
	obj->dep[1] = grctx;
	p->subctxId = id;
	if (p->flags == NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC_PREFER_LOWER)
		p->subctxId |= NV_CTXSHARE_SUBCTXID_PREFER_LOWER_SUCCESS;
	return NV_OK;
}

/*
 * The engine a compute or copy object is on, for GET_CLASS_ENGINEID: GR for compute; for copy,
 * kceGetEngineDescFromAllocParams (kernel_ce_context.c): VERSION_0's engineType is a CE index,
 * VERSION_1's an NV2080 copy engine type, no parameters CE 0. nvmock does not refuse what RM
 * would (an unknown version or engine, a CE the GPU lacks).
 */
static u32 engine_object_construct(struct nvmock_object *obj, const struct nvb0b5_alloc_params *p)
{
	if (obj->kind == NVMOCK_COMPUTE) {
		obj->engine_type = NV2080_ENGINE_TYPE_GRAPHICS;
		obj->parent->channel->tsg->gr_ctx = true;
		return NV_OK;
	}
	obj->engine_type = NV2080_ENGINE_TYPE_COPY0;
	if (p && p->version == NVB0B5_ALLOCATION_PARAMETERS_VERSION_0 &&
	    p->engineType <= NV2080_ENGINE_TYPE_COPY9 - NV2080_ENGINE_TYPE_COPY0)
		obj->engine_type += p->engineType;
	else if (p && p->version == NVB0B5_ALLOCATION_PARAMETERS_VERSION_1 &&
		 p->engineType >= NV2080_ENGINE_TYPE_COPY0 &&
		 p->engineType <= NV2080_ENGINE_TYPE_COPY9)
		obj->engine_type = p->engineType;
	return NV_OK;
}

static u32 channel_userd(struct nvmock_object *obj, struct nvmock_channel *ch,
			 const struct nv_channel_alloc_params *p)
{
	struct nvmock_object *mem_obj;
	struct nvmock_mem *mem;
	u32 status;

	if (!p->hUserdMemory[0]) {
		ch->userd_page = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!ch->userd_page)
			return NV_ERR_NO_MEMORY;
		ch->userd = page_address(ch->userd_page);
		return NV_OK;
	}
	/*
	 * USERD in a memory object of the client's, as libcuda does: a 512-byte slot
	 * (kfifoGetUserdSizeAlign_HAL, NV_RAMUSERD_CHAN_SIZE) in video memory, which the process
	 * reaches through BAR1 (bar1.c). kchannelCreateUserdMemDesc_GV100
	 * (arch/volta/kernel_channel_gv100.c) takes the memory by handle and a sub-range of it; a
	 * handle that is not memory of the client is NV_ERR_OBJECT_NOT_FOUND
	 * (serverutilGetResourceRefWithType with classId(Memory)). The slot checks below are
	 * nvmock's: the host side does not bound the offset (memdescCreateSubMem), and what GSP
	 * does with a slot outside the object is closed.
	 */
	mem_obj = nvmock_object_get(obj->client, p->hUserdMemory[0]);
	if (!mem_obj || (mem_obj->kind != NVMOCK_SYSMEM && mem_obj->kind != NVMOCK_VIDMEM))
		return NV_ERR_OBJECT_NOT_FOUND;
	mem = mem_obj->mem;
	if (p->userdOffset[0] > mem->size || mem->size - p->userdOffset[0] < NVRM_USERD_SIZE ||
	    p->userdOffset[0] % NVRM_USERD_SIZE)
		return NV_ERR_INVALID_ARGUMENT;
	status = nvmock_mem_back(mem_obj);
	if (status != NV_OK)
		return status;
	kref_get(&mem->buf->ref);
	ch->userd_buf = mem->buf;
	ch->userd = mem->buf->vaddr + p->userdOffset[0];
	return NV_OK;
}

static void channel_free(struct nvmock_channel *ch)
{
	if (ch->userd_page)
		__free_page(ch->userd_page);
	if (ch->userd_buf)
		nvmock_buf_put(ch->userd_buf);
	kfree(ch);
}

/* One of the context shares RM makes for a TSG in legacy mode, at a handle of RM's choosing. */
static u32 legacy_share(struct nvmock_object *tsg_obj, u32 flags, u32 *handle)
{
	struct nv_ctxshare_alloc_params p = { .flags = flags, .subctxId = 0xffffffffu };
	struct nvmock_object *obj;
	u32 status;

	obj = rm_made(tsg_obj, FERMI_CONTEXT_SHARE_A, NVMOCK_CTXSHARE, &status);
	if (!obj)
		return status;
	*handle = obj->handle;
	status = ctxshare_construct(obj, &p);
	if (status != NV_OK) {
		object_discard(obj);
		return status;
	}
	object_attach(obj);
	return NV_OK;
}

/*
 * A TSG's first channel without a context share puts it in legacy mode
 * (kchangrpapiSetLegacyMode_IMPL, kernel_channel_group_api.c): only while no share holds a
 * subcontext (else NV_ERR_INVALID_STATE), the heap shrinks to 2 IDs and RM allocates two shares
 * in the TSG's client, under the TSG, at handles of its choosing: SYNC (VEID 0) and ASYNC
 * (VEID 1). They are ordinary objects of the client: a later RM-chosen handle comes after
 * them, and freeing one frees the channels that run in it. The TSG stays in legacy mode.
 * libcuda makes its copy-engine TSGs' channels so (the H200 trace: hContextShare 0, lines
 * 2630-2760).
 */
static u32 tsg_legacy_mode(struct nvmock_object *tsg_obj)
{
	struct nvmock_tsg *tsg = tsg_obj->tsg;
	u32 status;

	if (tsg->subctx_ids)
		return NV_ERR_INVALID_STATE;
	tsg->subctx_max = SUBCTX_LEGACY;
	status = legacy_share(tsg_obj, NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_SYNC,
			      &tsg->legacy_share[0]);
	if (status == NV_OK)
		status = legacy_share(tsg_obj, NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC,
				      &tsg->legacy_share[1]);
	tsg->legacy = status == NV_OK;
	return status;
}

/*
 * What a channel runs in, checked as kchannelConstruct_IMPL (kernel_channel.c) checks it, in its
 * order, all NV_ERR_INVALID_ARGUMENT but the lookups: a context share and a VA space both named;
 * a channel under the device (a TSG of its own) naming a context share; a channel of a TSG
 * naming a VA space; a context share named in a TSG whose channels named none, or none named in
 * one whose channels did; a context share that is not in the client (NV_ERR_OBJECT_NOT_FOUND),
 * is not a context share (NV_ERR_INVALID_OBJECT_HANDLE, clientGetResourceRefByType) or is not
 * under this TSG (NV_ERR_INVALID_OBJECT_PARENT); with none named, the TSG's legacy share by
 * NVOS04_FLAGS_GROUP_CHANNEL_THREAD (0 SYNC, else ASYNC; tsg_legacy_mode()); then an engine
 * type that is valid and not the TSG's; the TSG's graphics context freed NV_ERR_OBJECT_NOT_FOUND
 * (kgrctxFromKernelChannel). The channel depends on its context share and on the TSG's graphics
 * context, or on the VA space a channel under the device names (refAddDependant): freed with
 * either.
 */
static u32 channel_share(struct nvmock_object *obj, const struct nv_channel_alloc_params *p)
{
	u32 thread = (p->flags >> NVOS04_FLAGS_GROUP_CHANNEL_THREAD_SHIFT) &
		     NVOS04_FLAGS_GROUP_CHANNEL_THREAD_MASK;
	struct nvmock_object *tsg_obj = obj->parent, *share;
	struct nvmock_tsg *tsg;
	u32 status;

	if (p->hContextShare && p->hVASpace)
		return NV_ERR_INVALID_ARGUMENT;
	if (tsg_obj->kind != NVMOCK_TSG) {
		if (p->hContextShare)
			return NV_ERR_INVALID_ARGUMENT;
		obj->dep[0] = vaspace_of(obj->client, p->hVASpace);
		return NV_OK;
	}
	tsg = tsg_obj->tsg;
	if (p->hVASpace)
		return NV_ERR_INVALID_ARGUMENT;
	if (tsg->nr_channels && tsg->legacy == !!p->hContextShare)
		return NV_ERR_INVALID_ARGUMENT;
	if (!p->hContextShare && !tsg->legacy) {
		status = tsg_legacy_mode(tsg_obj);
		if (status != NV_OK)
			return status;
	}
	/* The share named, or RM's own by thread: looked up alike (its own are under the TSG). */
	share = nvmock_object_get(obj->client,
				  p->hContextShare ?: tsg->legacy_share[!!thread]);
	if (!share)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (share->kind != NVMOCK_CTXSHARE)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	if (share->parent != tsg_obj)
		return NV_ERR_INVALID_OBJECT_PARENT;
	if (p->engineType && p->engineType < NV2080_ENGINE_TYPE_LAST &&
	    p->engineType != tsg->engine_type)
		return NV_ERR_INVALID_ARGUMENT;
	/*
	 * kchannelAllocMem_GM107 (arch/maxwell/kernel_channel_gm107.c):
	 * kfifoValidateSCGTypeAndRunqueue_GP102 refuses SCG type COMPUTE1 (thread 1) on runqueue 0.
	 * Measured on an H100: thread 1 NV_ERR_INVALID_ARGUMENT, thread 2 NV_OK (rmcases.py
	 * legacy_context_shares).
	 */
	if (thread == 1 && !(p->flags & NVOS04_FLAGS_GROUP_CHANNEL_RUNQUEUE))
		return NV_ERR_INVALID_ARGUMENT;
	obj->dep[0] = share;
	obj->dep[1] = grctx_of(tsg_obj);
	return obj->dep[1] ? NV_OK : NV_ERR_OBJECT_NOT_FOUND;
}

static u32 channel_construct(struct nvmock_object *obj, const void *params)
{
	const struct nv_channel_alloc_params *p = params;
	struct nvmock_gpu *gpu = obj->gpu;
	struct nvmock_channel *ch;
	u32 status;
	int chid;

	if (p->gpFifoEntries < 2 || p->gpFifoEntries > (1u << 20) ||
	    !is_power_of_2(p->gpFifoEntries))
		return NV_ERR_INVALID_ARGUMENT;
	status = channel_share(obj, p);
	if (status != NV_OK)
		return status;
	ch = kzalloc(sizeof(*ch), GFP_KERNEL);
	if (!ch)
		return NV_ERR_NO_MEMORY;
	status = channel_userd(obj, ch, p);
	if (status != NV_OK)
		goto err_free;
	chid = ida_alloc_max(&gpu->chids, 2047, GFP_KERNEL);
	if (chid < 0) {
		status = NV_ERR_INSUFFICIENT_RESOURCES;
		goto err_free;
	}
	ch->chid = chid;
	ch->gpu = gpu;
	ch->gpfifo_va = p->gpFifoOffset;
	ch->entries = p->gpFifoEntries;
	ch->scheduled = !(p->flags & NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING);
	if (obj->parent->kind == NVMOCK_TSG) {
		ch->tsg = obj->parent->tsg;
	} else {
		/* A channel under the device is a TSG of its own. */
		ch->tsg = tsg_create(gpu, obj->client->tgid);
		if (!ch->tsg) {
			ida_free(&gpu->chids, chid);
			status = NV_ERR_NO_MEMORY;
			goto err_free;
		}
		ch->own_tsg = true;
	}
	ch->tsg->nr_channels++;
	obj->channel = ch;
	nvmock_engine_add_channel(ch);
	return NV_OK;

err_free:
	channel_free(ch);
	return status;
}

static void channel_destroy(struct nvmock_channel *ch)
{
	struct nvmock_gpu *gpu = ch->gpu;

	nvmock_engine_remove_channel(ch);
	ch->tsg->nr_channels--;
	if (ch->own_tsg)
		tsg_destroy(ch->tsg);
	ida_free(&gpu->chids, ch->chid);
	channel_free(ch);
}

/* RM's own owners of heap memory, which no client may claim (g_heap_nvoc.h). */
#define HEAP_OWNER_RM_SCRATCH_BEGIN	0xDEAF0000u
#define HEAP_OWNER_RM_SCRATCH_END	(HEAP_OWNER_RM_SCRATCH_BEGIN + 3)

/* A field of an NVOS32 attr or attr2 word, by its shift and mask (nvos.h's DRF ranges). */
static u32 field_set(u32 word, unsigned int shift, u32 mask, u32 value)
{
	return (word & ~(mask << shift)) | (value << shift);
}

static u32 field_get(u32 word, unsigned int shift, u32 mask)
{
	return (word >> shift) & mask;
}

/*
 * The size device memory is allocated in: a whole number of the GPU page size RM picks for it.
 * memmgrDeterminePageSize (src/nvidia/src/kernel/gpu/mem_mgr/mem_mgr.c) takes attr PAGE_SIZE
 * (4 KiB, big, huge; attr2 PAGE_SIZE_HUGE 512 MiB) or, by default, _memmgrPickDefaultGpuPageSize:
 * huge (2 MiB) from 2 MiB up where huge pages are supported (Hopper), else the big page
 * (kgmmuGetMaxBigPageSize, 64 KiB on Hopper). memmgrAllocDetermineAlignment_GM107
 * (arch/maxwell/mem_mgr_gm107.c) then rounds the size up to it, and vidmemConstruct
 * (src/nvidia/src/kernel/mem_mgr/video_mem.c) answers the rounded size in the parameters.
 * System memory is 4 KiB pages by default and takes attr PAGE_SIZE the same way: measured on an
 * H100 (580.159.04), 4097 bytes came back as 8 KiB by default, 64 KiB with BIG and 2 MiB with
 * HUGE, in both classes (tests/vm/rmcases.py vidmem_sizes and sysmem_sizes).
 */
static u64 mem_page_size(const struct nvmock_object *obj, const struct nv_memory_alloc_params *p)
{
	u32 attr = field_get(p->attr, NVOS32_ATTR_PAGE_SIZE_SHIFT, NVOS32_ATTR_PAGE_SIZE_MASK);
	u32 huge = field_get(p->attr2, NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT,
			     NVOS32_ATTR2_PAGE_SIZE_HUGE_MASK);

	if (obj->kind != NVMOCK_VIDMEM && attr == NVOS32_ATTR_PAGE_SIZE_DEFAULT)
		return SZ_4K;
	switch (attr) {
	case NVOS32_ATTR_PAGE_SIZE_4KB:
		return SZ_4K;
	case NVOS32_ATTR_PAGE_SIZE_BIG:
		return SZ_64K;
	case NVOS32_ATTR_PAGE_SIZE_HUGE:
		return huge == NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB ? SZ_512M : SZ_2M;
	default:
		return p->size >= SZ_2M ? SZ_2M : SZ_64K;
	}
}

/*
 * What RM writes back into the parameters of memory it made, besides the size and the limit.
 * Measured on an H100, 580.159.04, for both classes, each page-size choice, the default
 * physicality and caching and sizes of 4 KiB, 64 KiB + 1 and 2 MiB (tests/vm/rmcases.py
 * memory_written_back):
 * - flags: MAP_NOT_REQUIRED set and KERNEL_MAPPING_MAP cleared (stdmemValidateParams,
 *   standard_mem.c: "These flags don't do anything in this path");
 * - attr: the page size RM used, and the physicality: contiguous video memory (vidmemConstruct
 *   and vidmemAllocResources, video_mem.c: PMA allocates it contiguous unless asked otherwise;
 *   nvmock never falls back to non-contiguous), non-contiguous system memory unless asked
 *   contiguous (sysmemConstruct, system_mem.c);
 * - attr2: ZBC PREFER_NO_ZBC (memmgrAllocHwResources_GM107, mem_mgr_gm107.c: uncompressed
 *   memory is no ZBC surface), GPU caching YES for video memory where the caller left it to RM
 *   (video_mem.c: "Video memory is always locally transparently cached") and NO for system
 *   memory (measured; where RM decides it is not traced), and the huge page size (2 MiB, or
 *   512 MiB where asked) with a huge page;
 * - format: the PTE kind, generic memory (nvmock models no compression or other kinds);
 * - alignment: the page size.
 */
static void mem_written_back(const struct nvmock_object *obj, struct nv_memory_alloc_params *p,
			     u64 page)
{
	bool vidmem = obj->kind == NVMOCK_VIDMEM;
	u32 physicality = field_get(p->attr, NVOS32_ATTR_PHYSICALITY_SHIFT,
				    NVOS32_ATTR_PHYSICALITY_MASK);
	u32 cacheable = field_get(p->attr2, NVOS32_ATTR2_GPU_CACHEABLE_SHIFT,
				  NVOS32_ATTR2_GPU_CACHEABLE_MASK);
	u32 size_attr = page == SZ_4K ? NVOS32_ATTR_PAGE_SIZE_4KB :
			page == SZ_64K ? NVOS32_ATTR_PAGE_SIZE_BIG : NVOS32_ATTR_PAGE_SIZE_HUGE;

	p->flags |= NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED;
	p->flags &= ~NVOS32_ALLOC_FLAGS_KERNEL_MAPPING_MAP;
	p->attr = field_set(p->attr, NVOS32_ATTR_PAGE_SIZE_SHIFT, NVOS32_ATTR_PAGE_SIZE_MASK,
			    size_attr);
	if (vidmem)
		physicality = physicality == NVOS32_ATTR_PHYSICALITY_NONCONTIGUOUS ?
			      NVOS32_ATTR_PHYSICALITY_NONCONTIGUOUS :
			      NVOS32_ATTR_PHYSICALITY_CONTIGUOUS;
	else if (physicality != NVOS32_ATTR_PHYSICALITY_CONTIGUOUS)
		physicality = NVOS32_ATTR_PHYSICALITY_NONCONTIGUOUS;
	p->attr = field_set(p->attr, NVOS32_ATTR_PHYSICALITY_SHIFT, NVOS32_ATTR_PHYSICALITY_MASK,
			    physicality);
	p->attr2 = field_set(p->attr2, NVOS32_ATTR2_ZBC_SHIFT, NVOS32_ATTR2_ZBC_MASK,
			     NVOS32_ATTR2_ZBC_PREFER_NO_ZBC);
	if (cacheable == NVOS32_ATTR2_GPU_CACHEABLE_DEFAULT)
		p->attr2 = field_set(p->attr2, NVOS32_ATTR2_GPU_CACHEABLE_SHIFT,
				     NVOS32_ATTR2_GPU_CACHEABLE_MASK,
				     vidmem ? NVOS32_ATTR2_GPU_CACHEABLE_YES :
					      NVOS32_ATTR2_GPU_CACHEABLE_NO);
	if (size_attr == NVOS32_ATTR_PAGE_SIZE_HUGE)
		p->attr2 = field_set(p->attr2, NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT,
				     NVOS32_ATTR2_PAGE_SIZE_HUGE_MASK,
				     page == SZ_512M ? NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB :
						       NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB);
	p->format = NVRM_PTE_KIND_GENERIC_MEMORY;
	p->alignment = page;
}

static u32 mem_construct(struct nvmock_object *obj, void *params)
{
	struct nv_memory_alloc_params *p = params;
	struct nvmock_gpu *gpu = obj->gpu;
	struct nvmock_mem *mem;
	u32 location;
	u64 size, page;

	/* A size of 0 is NV_ERR_INVALID_ARGUMENT, first (stdmemValidateParams). */
	if (!p->size)
		return NV_ERR_INVALID_ARGUMENT;
	/*
	 * stdmemValidateParams (src/nvidia/src/kernel/mem_mgr/standard_mem.c), after the size:
	 * an owner of 0 or ~0, or in RM's scratch range (HEAP_OWNER_RM_SCRATCH_BEGIN..END,
	 * g_heap_nvoc.h), is refused. Measured: 580.159.04 answered it to an owner of 0 (H100,
	 * tools/gpu/results/2026-11-26-probe-cost-callBC-logs.txt); libcuda names its client.
	 */
	if (!p->owner || p->owner == U32_MAX ||
	    (p->owner >= HEAP_OWNER_RM_SCRATCH_BEGIN && p->owner <= HEAP_OWNER_RM_SCRATCH_END))
		return NV_ERR_INVALID_OWNER;
	/*
	 * After the checks above, a virtual allocation, or a location other than the class's, is
	 * NV_ERR_INVALID_ARGUMENT: sysmemConstruct (src/nvidia/src/kernel/mem_mgr/system_mem.c)
	 * refuses system memory whose attr says LOCATION_VIDMEM (0, the default), vidmemConstruct
	 * (video_mem.c) video memory whose attr says anything else. Measured: 580.159.04 answered
	 * that to ioctlbench's owner-named system memory with attr 0 (call BC, an H100).
	 */
	location = field_get(p->attr, NVOS32_ATTR_LOCATION_SHIFT, NVOS32_ATTR_LOCATION_MASK);
	if (p->flags & NVOS32_ALLOC_FLAGS_VIRTUAL)
		return NV_ERR_INVALID_ARGUMENT;
	if (obj->kind == NVMOCK_SYSMEM && location == NVOS32_ATTR_LOCATION_VIDMEM)
		return NV_ERR_INVALID_ARGUMENT;
	if (obj->kind == NVMOCK_VIDMEM && location != NVOS32_ATTR_LOCATION_VIDMEM)
		return NV_ERR_INVALID_ARGUMENT;
	/*
	 * Past the memory there is, NV_ERR_NO_MEMORY, from the heap, after every check above
	 * (measured on an H100: 2^41 bytes of video memory, and with an owner of 0
	 * NV_ERR_INVALID_OWNER instead: rmcases.py memory_refusals, alloc_refusal_order). nvmock
	 * answers it to anything past 2^40 in either class before rounding it (the system-memory
	 * case is not measured).
	 */
	if (p->size > (1ull << 40))
		return NV_ERR_NO_MEMORY;
	page = mem_page_size(obj, p);
	size = round_up(p->size, page);
	if (obj->kind == NVMOCK_VIDMEM && size > gpu->fb_size - gpu->fb_used)
		return NV_ERR_NO_MEMORY;
	mem = kzalloc(sizeof(*mem), GFP_KERNEL);
	if (!mem)
		return NV_ERR_NO_MEMORY;
	p->size = size;
	mem->refs = 1;
	mem->size = p->size;
	if (!nvmock_engine_add_mem(gpu, mem)) {
		kfree(mem);
		return NV_ERR_NO_MEMORY;
	}
	if (obj->kind == NVMOCK_VIDMEM) {
		gpu->fb_used += p->size;
		gpu->fb_peak = max(gpu->fb_peak, gpu->fb_used);
	}
	obj->mem = mem;
	/* RM answers in the parameters: where the memory is, its last byte, and how it made it. */
	p->offset = mem->va;
	p->limit = p->size - 1;
	mem_written_back(obj, p, page);
	return NV_OK;
}

static void mem_destroy(struct nvmock_object *obj)
{
	struct nvmock_mem *mem = obj->mem;

	/* The memory lives while a duplicate of it does (memDestruct drops a memdesc reference). */
	if (--mem->refs)
		return;
	nvmock_engine_remove_mem(obj->gpu, mem);
	if (obj->kind == NVMOCK_VIDMEM)
		obj->gpu->fb_used -= mem->size;
	if (mem->buf)
		nvmock_buf_put(mem->buf);
	kfree(mem);
}

static u32 construct(const struct nvmock_caller *caller, struct nvmock_object *obj, void *params)
{
	switch (obj->kind) {
	case NVMOCK_DEVICE:
		return device_construct(caller, obj, params);
	case NVMOCK_SUBDEVICE:
		return subdevice_construct(obj, params);
	case NVMOCK_USERMODE:
		return usermode_construct(caller, params);
	case NVMOCK_TSG:
		return tsg_construct(obj, params);
	case NVMOCK_CHANNEL:
		return channel_construct(obj, params);
	case NVMOCK_CTXSHARE:
		return ctxshare_construct(obj, params);
	case NVMOCK_COMPUTE:
	case NVMOCK_COPY:
		return engine_object_construct(obj, params);
	case NVMOCK_SYSMEM:
	case NVMOCK_VIDMEM:
		return mem_construct(obj, params);
	default:
		return NV_OK;
	}
}

static void destruct(struct nvmock_object *obj)
{
	switch (obj->kind) {
	case NVMOCK_TSG:
		tsg_destroy(obj->tsg);
		break;
	case NVMOCK_CHANNEL:
		channel_destroy(obj->channel);
		break;
	case NVMOCK_CTXSHARE:
		obj->parent->tsg->subctx_ids &= ~BIT_ULL(obj->subctx_id);
		break;
	case NVMOCK_SYSMEM:
	case NVMOCK_VIDMEM:
		mem_destroy(obj);
		break;
	default:
		break;
	}
}

/* -- the tree -------------------------------------------------------------------------------- */

/*
 * An object that depends on @obj (one of its dep), in @obj's client. Only VA spaces, context
 * shares and graphics contexts have dependents here (tsg_construct(), ctxshare_construct(),
 * channel_share()).
 */
static struct nvmock_object *dependent_of(struct nvmock_object *obj)
{
	struct nvmock_object *other;
	unsigned long index;

	if (obj->kind != NVMOCK_VASPACE && obj->kind != NVMOCK_CTXSHARE &&
	    obj->kind != NVMOCK_GRCTX)
		return NULL;
	xa_for_each(&obj->client->objects, index, other)
		if (other->kind != NVMOCK_INVALID && (other->dep[0] == obj || other->dep[1] == obj))
			return other;
	return NULL;
}

/*
 * Invalidate an object with what is under it and what depends on it: each is destructed (a
 * channel leaves the engine, a TSG goes, a share gives back its VEID), and keeps its handle,
 * class and parent as kind NVMOCK_INVALID until the client frees it. Children before their
 * parent, as RM's pending free list orders them.
 */
static void object_invalidate(struct nvmock_object *obj)
{
	struct nvmock_object *child, *dep;

	while ((dep = dependent_of(obj)))
		object_invalidate(dep);
	list_for_each_entry_reverse(child, &obj->children, sibling)
		if (child->kind != NVMOCK_INVALID)
			object_invalidate(child);
	destruct(obj);
	atomic_dec(&nvmock_counts[obj->kind]);
	atomic_inc(&nvmock_counts[NVMOCK_INVALID]);
	obj->kind = NVMOCK_INVALID;
}

/*
 * RM frees an object with its children, and invalidates what depends on it that is not below
 * it (serverFreeResourceTree, resserv's rs_server.c: clientUpdatePendingFreeList_IMPL puts the
 * children and the dependents, with theirs, ahead of the object on the pending free list, and
 * each entry that is not a descendant of the object freed is freed with bInvalidateOnly): the
 * TSGs and context shares made on a VA space, the channels that run in a context share and the
 * channels and shares of a TSG whose graphics context goes are destroyed, and their handles
 * stay in the client, which must free them (measured on an H100: rmcases.py dependents_freed,
 * where each still answered CLIENT_GET_HANDLE_INFO). A dependent can be a sibling of the object
 * or of an ancestor being freed, so each list is read again after every free.
 */
static void object_free(struct nvmock_object *obj)
{
	struct nvmock_object *dep;

	while ((dep = dependent_of(obj)))
		object_invalidate(dep);
	/* Children last made first: a channel goes before its TSG, a TSG before its device. */
	while (!list_empty(&obj->children))
		object_free(list_last_entry(&obj->children, struct nvmock_object, sibling));
	if (obj->kind == NVMOCK_CLIENT)
		return;
	destruct(obj);
	xa_erase(&obj->client->objects, obj->handle);
	list_del(&obj->sibling);
	atomic_dec(&nvmock_counts[obj->kind]);
	kfree(obj);
}

static void client_free(struct nvmock_client *client)
{
	object_free(&client->root);
	xa_erase(&clients, client->handle);
	list_del(&client->node);
	xa_destroy(&client->objects);
	atomic_dec(&nvmock_counts[NVMOCK_CLIENT]);
	kfree(client);
}

static u32 client_alloc(const struct nvmock_caller *caller, u32 *hnew)
{
	struct nvmock_client *client;
	u32 handle = *hnew;
	int err;

	if (handle && xa_load(&clients, handle))
		return NV_ERR_INSERT_DUPLICATE_NAME;
	client = kzalloc(sizeof(*client), GFP_KERNEL);
	if (!client)
		return NV_ERR_NO_MEMORY;
	while (!handle) {
		u32 candidate = NVRM_CLIENT_HANDLE_BASE + (next_client_handle++ & 0xFFFFF);

		if (!xa_load(&clients, candidate))
			handle = candidate;
	}
	err = xa_insert(&clients, handle, client, GFP_KERNEL);
	if (err) {
		kfree(client);
		return err == -EBUSY ? NV_ERR_INSERT_DUPLICATE_NAME : NV_ERR_NO_MEMORY;
	}
	client->handle = handle;
	client->owner = caller->file;
	client->tgid = caller->kernel ? 0 : current->tgid;
	xa_init(&client->objects);
	client->root.handle = handle;
	client->root.hclass = NV01_ROOT_CLIENT;
	client->root.kind = NVMOCK_CLIENT;
	client->root.client = client;
	INIT_LIST_HEAD(&client->root.children);
	list_add_tail(&client->node, &client_list);
	atomic_inc(&nvmock_counts[NVMOCK_CLIENT]);
	*hnew = handle;
	return NV_OK;
}

/* RS_UNIQUE_HANDLE_RANGE (resserv's rs_client.h): the handles RM picks, from the base on. */
#define OBJECT_HANDLE_RANGE	0x80000u

/*
 * The new object's handle, as clientAssignResourceHandle (580.142, resserv's rs_client.c): 0
 * asks for one; the client's own handle is NV_ERR_INVALID_OBJECT_HANDLE, one in use
 * NV_ERR_INSERT_DUPLICATE_NAME (clientValidateNewResourceHandle). clientGenResourceHandle
 * cycles through the range once and answers NV_ERR_INSUFFICIENT_RESOURCES when every handle
 * of it is taken.
 */
static u32 pick_handle(struct nvmock_client *client, u32 *hnew)
{
	u32 handle = *hnew;
	u32 tried;

	if (handle == client->handle)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	if (handle)
		return xa_load(&client->objects, handle) ? NV_ERR_INSERT_DUPLICATE_NAME : NV_OK;
	for (tried = 0; tried < OBJECT_HANDLE_RANGE; tried++) {
		handle = NVRM_OBJECT_HANDLE_BASE + client->next_handle++ % OBJECT_HANDLE_RANGE;
		if (!xa_load(&client->objects, handle)) {
			*hnew = handle;
			return NV_OK;
		}
	}
	return NV_ERR_INSUFFICIENT_RESOURCES;
}

/*
 * A new object at @handle under @parent: in the client's table, so its handle is taken, but not
 * yet in the tree (object_attach() puts it there once constructed, object_discard() drops it).
 */
static struct nvmock_object *object_new(struct nvmock_client *client,
					struct nvmock_object *parent, u32 handle, u32 hclass,
					enum nvmock_kind kind)
{
	struct nvmock_object *obj = kzalloc(sizeof(*obj), GFP_KERNEL);

	if (!obj)
		return NULL;
	obj->handle = handle;
	obj->hclass = hclass;
	obj->kind = kind;
	obj->client = client;
	obj->parent = parent;
	obj->gpu = parent->gpu;
	INIT_LIST_HEAD(&obj->children);
	if (xa_insert(&client->objects, handle, obj, GFP_KERNEL)) {
		kfree(obj);
		return NULL;
	}
	return obj;
}

static void object_attach(struct nvmock_object *obj)
{
	list_add_tail(&obj->sibling, &obj->parent->children);
	atomic_inc(&nvmock_counts[obj->kind]);
}

static void object_discard(struct nvmock_object *obj)
{
	xa_erase(&obj->client->objects, obj->handle);
	kfree(obj);
}

static u32 copy_params(const struct class_desc *desc, const void __user *uparams,
		       const void *kparams, void *buf)
{
	if (!uparams && !kparams)
		return desc->params_required ? NV_ERR_INVALID_ARGUMENT : NV_OK;
	if (!desc->params_size)
		return NV_OK;
	if (kparams) {
		memcpy(buf, kparams, desc->params_size);
		return NV_OK;
	}
	return copy_from_user(buf, uparams, desc->params_size) ? NV_ERR_INVALID_POINTER : NV_OK;
}

/*
 * RM_ALLOC. hnew is in/out: 0 asks RM for a handle. The class's parameters are copied in by the
 * size RM knows for the class (paramsSize is not trusted), and copied back out on success.
 */
u32 nvmock_rm_alloc(const struct nvmock_caller *caller, u32 hroot, u32 hparent, u32 *hnew,
		    u32 hclass, const void __user *uparams, const void *kparams)
{
	const struct class_desc *desc = class_of(hclass);
	union {
		struct nv_channel_alloc_params channel;
		struct nv_memory_alloc_params mem;
		u8 raw[sizeof(struct nv_channel_alloc_params)];
	} params;
	struct nvmock_client *client;
	struct nvmock_object *parent, *obj;
	bool have_params = uparams || kparams;
	u32 status;

	if (hclass == NV_MEMORY_FABRIC)
		return nvmock_fabric_alloc(caller, hroot, hparent, uparams || kparams);
	if (!desc)
		return NV_ERR_INVALID_CLASS;
	/*
	 * serverAllocResource (resserv's rs_server.c) copies the parameters in
	 * (serverAllocApiCopyIn, then rmapiParamsCopyInit in param_copy.c) before it finds the
	 * client: NULL parameters of a class that requires them (RS_REQUIRED, resource_list.h) are
	 * NV_ERR_INVALID_ARGUMENT whatever else is wrong. Measured on an H100 with an unknown
	 * client, an unknown parent and a taken handle (rmcases.py alloc_refusal_order).
	 */
	if (!have_params && desc->params_required)
		return NV_ERR_INVALID_ARGUMENT;
	/*
	 * A client's handle is asked for in hRoot, 0 for one of RM's choosing (serverAllocClient,
	 * rs_server.c, built with RS_COMPATABILITY_MODE), and comes back in hObjectNew.
	 */
	if (desc->kind == NVMOCK_CLIENT) {
		u32 handle = hroot;

		status = client_alloc(caller, &handle);
		if (status != NV_OK)
			return status;
		*hnew = handle;
		/*
		 * The optional parameter is an NvHandle, where RM writes the new handle
		 * (rmclientConstruct, src/nvidia/src/kernel/rmapi/client.c).
		 */
		if (kparams)
			memcpy((void *)kparams, &handle, sizeof(handle));
		else if (uparams && copy_to_user((void __user *)uparams, &handle, sizeof(handle)))
			pr_debug("client 0x%x: its parameter is not writable\n", handle);
		return NV_OK;
	}

	status = object_call_client(caller, hroot, &client);
	if (status != NV_OK)
		return status;
	/*
	 * RM's serverAllocResourceUnderLock (src/nvidia/src/kernel/rmapi/alloc_free.c), before the
	 * handle is taken: an object named as its client is NV_ERR_INVALID_OBJECT_PARENT, a parent
	 * the client does not have NV_ERR_OBJECT_NOT_FOUND, one of a class the new one may not live
	 * under NV_ERR_INVALID_OBJECT_PARENT (measured on an H100: rmcases.py object_handles).
	 */
	if (*hnew == hroot)
		return NV_ERR_INVALID_OBJECT_PARENT;
	parent = nvmock_object_get(client, hparent);
	if (!parent)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (!(desc->parents & BIT_KIND(parent->kind)))
		return NV_ERR_INVALID_OBJECT_PARENT;
	status = pick_handle(client, hnew);
	if (status != NV_OK)
		return status;
	memset(&params, 0, sizeof(params));
	status = copy_params(desc, uparams, kparams, &params);
	if (status != NV_OK)
		return status;

	obj = object_new(client, parent, *hnew, hclass, desc->kind);
	if (!obj)
		return NV_ERR_NO_MEMORY;
	status = construct(caller, obj, have_params ? &params : NULL);
	if (status != NV_OK) {
		object_discard(obj);
		return status;
	}
	object_attach(obj);

	/*
	 * RM copies every class's parameters back on success (serverAllocApiCopyOut,
	 * alloc_free.c); nvmock writes back those its constructors change: memory's and a
	 * context share's.
	 */
	if (obj->kind != NVMOCK_SYSMEM && obj->kind != NVMOCK_VIDMEM &&
	    obj->kind != NVMOCK_CTXSHARE)
		return NV_OK;
	if (uparams && copy_to_user((void __user *)uparams, &params, desc->params_size)) {
		object_free(obj);
		return NV_ERR_INVALID_POINTER;
	}
	if (kparams)
		memcpy((void *)kparams, &params, desc->params_size);
	return NV_OK;
}

/*
 * RM_FREE: hObjectOld == hRoot frees the whole client. An object the client does not have is
 * NV_OK: RM is built with RS_COMPATABILITY_MODE, and serverFreeResourceTreeLockAndFindResource
 * (resserv's rs_server.c) answers a missing resource so. Measured on an H100: an unknown handle
 * and a handle freed twice both NV_OK (tests/vm/rmcases.py frees).
 */
u32 nvmock_rm_free(const struct nvmock_caller *caller, u32 hroot, u32 hparent, u32 hold)
{
	struct nvmock_client *client;
	struct nvmock_object *obj;
	u32 status;

	status = object_call_client(caller, hroot, &client);
	if (status != NV_OK)
		return status;
	if (hold == hroot) {
		client_free(client);
		return NV_OK;
	}
	obj = nvmock_object_get(client, hold);
	if (obj)
		object_free(obj);
	return NV_OK;
}

/*
 * RM_DUP_OBJECT: a new handle, in hClient under hParent, for the object hObjectSrc of
 * hClientSrc, in the order of serverCopyResource (resserv's rs_server.c): either client unknown
 * NV_ERR_INVALID_OBJECT_HANDLE, a destination client of another file NV_ERR_INVALID_CLIENT
 * (clientValidate), a source object or a destination parent the clients do not have
 * NV_ERR_OBJECT_NOT_FOUND, an object that cannot be copied NV_ERR_INVALID_ARGUMENT (resCanCopy;
 * nvmock copies memory only), then the new handle as for RM_ALLOC (clientAssignResourceHandle).
 * The source client may be another file's: RM's default share policy lets a process duplicate
 * what its own clients hold (serverInitGlobalSharePolicies, sharing.c: RS_SHARE_TYPE_PID), and
 * refuses another process's (rsAccessCheckRights, rs_access_map.c:
 * NV_ERR_INSUFFICIENT_PERMISSIONS; RM_SHARE is not modelled). Measured on an H100 (580.159.04),
 * tests/vm/rmcases.py duplicates and clients_not_ones_own: the same process's other file NV_OK,
 * a device NV_ERR_INVALID_ARGUMENT, an unknown source NV_ERR_OBJECT_NOT_FOUND, an unknown
 * destination client NV_ERR_INVALID_OBJECT_HANDLE; another process's source: source only.
 * A memory copy shares the source's state: memCopyConstruct (src/nvidia/src/kernel/mem_mgr/mem.c)
 * takes another reference on its memory descriptor, so the memory lives until the last handle
 * to it is freed. The new parent must be a device or subdevice of the source's GPU (else
 * NV_ERR_INVALID_OBJECT_PARENT).
 */
u32 nvmock_rm_dup(const struct nvmock_caller *caller, u32 hclient, u32 hparent, u32 *hobject,
		  u32 hclient_src, u32 hobject_src)
{
	struct nvmock_client *client, *src_client;
	struct nvmock_object *parent, *src, *obj;
	const struct class_desc *desc;
	u32 status;

	src_client = nvmock_client_get(hclient_src);
	if (!src_client)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	status = object_call_client(caller, hclient, &client);
	if (status != NV_OK)
		return status;
	src = nvmock_object_get(src_client, hobject_src);
	parent = nvmock_object_get(client, hparent);
	if (!src || !parent)
		return NV_ERR_OBJECT_NOT_FOUND;
	/* serverCopyResource (rs_server.c): a source RM invalidated is lost. */
	if (src->kind == NVMOCK_INVALID)
		return NV_ERR_RESOURCE_LOST;
	if (src->kind != NVMOCK_VIDMEM && src->kind != NVMOCK_SYSMEM)
		return NV_ERR_INVALID_ARGUMENT;
	desc = class_of(src->hclass);
	if (!desc || !(desc->parents & BIT_KIND(parent->kind)) || parent->gpu != src->gpu)
		return NV_ERR_INVALID_OBJECT_PARENT;
	status = pick_handle(client, hobject);
	if (status != NV_OK)
		return status;
	if (!caller->kernel && src_client->tgid != current->tgid)
		return NV_ERR_INSUFFICIENT_PERMISSIONS;
	/* On the source's GPU: the parent's, as checked above. */
	obj = object_new(client, parent, *hobject, src->hclass, src->kind);
	if (!obj)
		return NV_ERR_NO_MEMORY;
	obj->mem = src->mem;
	obj->mem->refs++;
	object_attach(obj);
	return NV_OK;
}

/*
 * VID_HEAP_CONTROL's INFO (_nvos32FunctionInfo, rmapi_deprecated_vidheapctrl.c): the heap's
 * size and what is free of it, asked of the subdevice of the device hparent. Measured on an
 * H100: NV_OK with a total above 0. Bad handles answer as an RM_ALLOC's do (not measured).
 */
u32 nvmock_heap_info(const struct nvmock_caller *caller, u32 hroot, u32 hparent, u64 *total,
		     u64 *free)
{
	struct nvmock_client *client;
	struct nvmock_object *parent;
	u32 status;

	lockdep_assert_held(&nvmock_lock);
	status = object_call_client(caller, hroot, &client);
	if (status != NV_OK)
		return status;
	parent = nvmock_object_get(client, hparent);
	if (!parent)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (parent->kind != NVMOCK_DEVICE && parent->kind != NVMOCK_SUBDEVICE)
		return NV_ERR_INVALID_OBJECT_PARENT;
	*total = parent->gpu->fb_size;
	*free = parent->gpu->fb_size - parent->gpu->fb_used;
	return NV_OK;
}

/* The file is going away: so are the clients allocated through it (NULL: kernel clients). */
void nvmock_free_clients_of(struct file *file)
{
	struct nvmock_client *client, *next;

	mutex_lock(&nvmock_lock);
	list_for_each_entry_safe(client, next, &client_list, node)
		if (client->owner == file)
			client_free(client);
	mutex_unlock(&nvmock_lock);
}
