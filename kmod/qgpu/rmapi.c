// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the target driver's in-kernel RM entry, through which the schedulers open and close
 * channels as a kernel client (FIFO_DISABLE_CHANNELS, the lever that acts on GSP GPUs) and
 * timeslice.c reads and sets the tenants' TSG timeslices (GET_TIMESLICE, SET_TIMESLICE).
 *
 * The entry is nvidia.ko's kernel-client interface, the one nvidia-modeset uses
 * (nvidia_get_rm_ops, declared in ../uapi/nvrm_kapi.h); nvmock exports the same. It is taken at run
 * time (symbol_get), so qgpu loads against either driver, and it needs the driver's exact
 * version. qgpu names rm_version= if given, else nvmock's own for target=nvmock, else the bare
 * branch (RM_BRANCH). On a mismatch the driver answers NV_ERR_GENERIC and writes its own
 * version into version_string (nvidia_get_rm_ops in kernel-open/nvidia/nv-modeset-interface.c);
 * qgpu asks again with that version only if it is of the branch qgpu's ABI was written for
 * (580: the structs of ../uapi/nvrm*.h are 580.142's), and otherwise refuses, in one log line.
 * The version in use is /sys/kernel/qgpu/rm_version. Against nvidia.ko this has not run on
 * hardware. Without the entry time slicing is refused
 * (-EOPNOTSUPP) and tracking, memory limits and the tenant guard still work.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "../uapi/nvmock.h"
#include "../uapi/nvrm_kapi.h"
#include "qgpu.h"

static char *rm_version = "";
module_param(rm_version, charp, 0444);
MODULE_PARM_DESC(rm_version, "target=nvidia: the driver's exact version, for its kernel RM entry");

/* The driver branch whose ABI qgpu speaks: a version from it starts with this. */
#define RM_BRANCH "580."

static struct nvrm_kernel_ops rm_ops;
static char bound_version[64];
/*
 * The driver's stack may be used by one thread at a time: the GPUs' threads and the hooks'
 * queries share it. It may be NULL after a successful alloc_stack (nvidia.ko built without an
 * alternate stack, as the open modules are), and is passed back as it came; a NULL stack is
 * nothing to share, and the calls then go to RM at once, as the tenants' own ioctls do.
 */
static DEFINE_MUTEX(rm_stack_lock);
static void *rm_stack;
static bool bound;

/* The version to name first: the parameter, else nvmock's own (built with qgpu), else none. */
static const char *target_version(void)
{
	if (*rm_version)
		return rm_version;
	return strcmp(qgpu_target, "nvmock") ? RM_BRANCH : NVMOCK_VERSION_STRING;
}

/*
 * Ask for the ops naming @version; on a mismatch, the driver's answer is learnt if it is of
 * RM_BRANCH and asked for once more. Return: RM's status.
 */
static u32 get_rm_ops(u32 (*get_ops)(struct nvrm_kernel_ops *ops), const char *version)
{
	const char *answered;
	u32 status;

	memset(&rm_ops, 0, sizeof(rm_ops));
	rm_ops.version_string = version;
	status = get_ops(&rm_ops);
	if (status == NV_OK) {
		strscpy(bound_version, version, sizeof(bound_version));
		return status;
	}
	answered = rm_ops.version_string;
	if (!answered || answered == version) {
		pr_warn("%s refused RM ops for version %s (status 0x%x) without naming its own: %s\n",
			qgpu_target, version, status, "time slicing is off");
		return status;
	}
	if (strncmp(answered, RM_BRANCH, strlen(RM_BRANCH))) {
		pr_warn("%s is version %.32s, not of the %sx branch qgpu's RM ABI was written for: %s\n",
			qgpu_target, answered, RM_BRANCH, "time slicing is off");
		return status;
	}
	strscpy(bound_version, answered, sizeof(bound_version));
	memset(&rm_ops, 0, sizeof(rm_ops));
	rm_ops.version_string = bound_version;
	status = get_ops(&rm_ops);
	if (status != NV_OK) {
		pr_warn("%s refused RM ops for its own version %s (status 0x%x): %s\n",
			qgpu_target, bound_version, status, "time slicing is off");
		return status;
	}
	if (*rm_version || strcmp(version, RM_BRANCH))
		pr_info("%s is version %s, not %s: using its RM entry (same branch)\n",
			qgpu_target, bound_version, version);
	return status;
}

/**
 * qgpu_rmapi_init() - bind the target driver's in-kernel RM entry, if it can be
 *
 * Without it (no entry, another branch, no stack) qgpu still loads: time slicing is off.
 *
 * Context: module init.
 * Return: 0.
 */
int qgpu_rmapi_init(void)
{
	u32 (*get_ops)(struct nvrm_kernel_ops *ops);

	get_ops = symbol_get(nvidia_get_rm_ops);
	if (!get_ops) {
		pr_warn("%s has no nvidia_get_rm_ops: time slicing is off\n", qgpu_target);
		return 0;
	}
	if (get_rm_ops(get_ops, target_version()) != NV_OK)
		goto err_put;
	if (!rm_ops.op || !rm_ops.alloc_stack || !rm_ops.free_stack) {
		pr_warn("%s's RM ops lack op or stack calls: time slicing is off\n", qgpu_target);
		goto err_put;
	}
	if (rm_ops.alloc_stack(&rm_stack)) {
		pr_warn("no RM stack: time slicing is off\n");
		goto err_put;
	}
	bound = true;
	return 0;

err_put:
	bound_version[0] = '\0';
	symbol_put(nvidia_get_rm_ops);
	return 0;
}

/**
 * qgpu_rmapi_exit() - free the RM stack and let go of the driver's RM entry
 *
 * Context: module exit, after the schedulers and timeslices are done with it.
 */
void qgpu_rmapi_exit(void)
{
	if (!bound)
		return;
	bound = false;
	rm_ops.free_stack(rm_stack);
	rm_stack = NULL;
	symbol_put(nvidia_get_rm_ops);
}

/**
 * qgpu_rmapi_available() - whether the in-kernel RM entry is bound
 *
 * Return: true if the schedulers and timeslices can call RM.
 */
bool qgpu_rmapi_available(void)
{
	return bound;
}

/**
 * qgpu_rmapi_version() - the driver version the RM entry was bound with
 *
 * Return: the version, or "" when nothing is bound.
 */
const char *qgpu_rmapi_version(void)
{
	return bound ? bound_version : "";
}

/*
 * One RM call as a kernel client. The op reads the parameters from the union member of its op
 * and writes its answer back into the same member (rm_kernel_rmapi_op in osapi.c); each caller
 * presets status to NV_ERR_GENERIC, so an op the driver did not run does not read as NV_OK.
 */
static void rm_op(struct nvrm_kernel_op *call)
{
	if (!rm_stack) {
		rm_ops.op(NULL, call);
		return;
	}
	mutex_lock(&rm_stack_lock);
	rm_ops.op(rm_stack, call);
	mutex_unlock(&rm_stack_lock);
}

/*
 * NV04_ALLOC takes NVOS64 (nv-kernel-rmapi-ops.h; _nv04AllocWithAccess in entry_points.c). The
 * driver reads pRightsRequested as a kernel pointer when it is not NULL (serverAllocApiCopyIn,
 * src/nvidia/src/kernel/rmapi/alloc_free.c): NULL asks for the default rights. paramsSize is
 * set for the record; the driver copies the size its class table gives (rmapiParamsCopyInit and
 * rmapiGetClassAllocParamSize). The status comes back at NVOS64's status (offset 40).
 */
static u32 rm_alloc(u32 hroot, u32 hparent, u32 *hnew, u32 hclass, void *params, u32 size)
{
	struct nvrm_kernel_op call = {
		.op = NVRM_KERNEL_OP_ALLOC,
		.params.alloc = {
			.hRoot = hroot,
			.hObjectParent = hparent,
			.hObjectNew = *hnew,
			.hClass = hclass,
			.pAllocParms = (u64)(uintptr_t)params,
			.pRightsRequested = 0,
			.paramsSize = size,
			.flags = 0,
			.status = NV_ERR_GENERIC,
		},
	};

	rm_op(&call);
	*hnew = call.params.alloc.hObjectNew;
	return call.params.alloc.status;
}

/**
 * qgpu_rmapi_free() - free an RM object as a kernel client (NV01_FREE)
 * @hclient: the client
 * @hobject: the object; the client itself frees all it holds
 *
 * NV01_FREE takes NVOS00; the driver uses hRoot and hObjectOld (_nv01Free in entry_points.c).
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 * Return: RM's status.
 */
u32 qgpu_rmapi_free(u32 hclient, u32 hobject)
{
	struct nvrm_kernel_op call = {
		.op = NVRM_KERNEL_OP_FREE,
		.params.free = {
			.hRoot = hclient,
			.hObjectParent = hclient,
			.hObjectOld = hobject,
			.status = NV_ERR_GENERIC,
		},
	};

	rm_op(&call);
	return call.params.free.status;
}

/**
 * qgpu_rmapi_gpu_open() - a kernel client with a GPU's device and subdevice
 * @gpu: the GPU (its device instance)
 * @hclient: set to the client's handle
 * @hsubdevice: set to the subdevice's handle, to send controls to
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 * Return: 0, -EOPNOTSUPP without the RM entry, -ENODEV if RM refused (nothing is left).
 */
int qgpu_rmapi_gpu_open(u32 gpu, u32 *hclient, u32 *hsubdevice)
{
	struct nv0080_alloc_params device = { .deviceId = gpu };
	struct nv2080_alloc_params subdevice = { .subDeviceId = 0 };
	u32 client = 0, hdevice = 0, hsub = 0;
	u32 status;

	if (!bound)
		return -EOPNOTSUPP;
	status = rm_alloc(0, 0, &client, NV01_ROOT, NULL, 0);
	if (status != NV_OK)
		goto err;
	status = rm_alloc(client, client, &hdevice, NV01_DEVICE_0, &device, sizeof(device));
	if (status != NV_OK)
		goto err_client;
	status = rm_alloc(client, hdevice, &hsub, NV20_SUBDEVICE_0, &subdevice,
			  sizeof(subdevice));
	if (status != NV_OK)
		goto err_client;
	*hclient = client;
	*hsubdevice = hsub;
	return 0;

err_client:
	qgpu_rmapi_free(client, client);
err:
	pr_err("gpu%u: no kernel RM client: status 0x%x\n", gpu, status);
	return -ENODEV;
}

/**
 * qgpu_rmapi_gpu_close() - free a kernel client made by qgpu_rmapi_gpu_open()
 * @hclient: the client
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 */
void qgpu_rmapi_gpu_close(u32 hclient)
{
	if (bound)
		qgpu_rmapi_free(hclient, hclient);
}

/*
 * NV04_CONTROL takes NVOS54; params is a kernel pointer, used in place, and the answer is
 * written back into it.
 */
static u32 rm_control(u32 hclient, u32 hobject, u32 cmd, void *params, u32 size)
{
	struct nvrm_kernel_op call = {
		.op = NVRM_KERNEL_OP_CONTROL,
		.params.control = {
			.hClient = hclient,
			.hObject = hobject,
			.cmd = cmd,
			.flags = 0,
			.params = (u64)(uintptr_t)params,
			.paramsSize = size,
			.status = NV_ERR_GENERIC,
		},
	};

	rm_op(&call);
	return call.params.control.status;
}

/**
 * qgpu_rmapi_set_channels() - close or open tenants' channels (FIFO_DISABLE_CHANNELS)
 * @hclient: qgpu's kernel client
 * @hsubdevice: its subdevice on the channels' GPU
 * @disable: close (true) or open
 * @clients: each channel's client
 * @channels: the channels
 * @n: how many, at most NV2080_DISABLE_CHANNELS_MAX
 *
 * All or nothing in RM: one bad channel fails the call.
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 * Return: RM's status; NV_ERR_NOT_SUPPORTED without the RM entry.
 */
u32 qgpu_rmapi_set_channels(u32 hclient, u32 hsubdevice, bool disable,
			    const u32 *clients, const u32 *channels, u32 n)
{
	struct nv2080_fifo_disable_channels_params *p;
	u32 status;

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	if (n > NV2080_DISABLE_CHANNELS_MAX)
		return NV_ERR_INVALID_ARGUMENT;
	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return NV_ERR_NO_MEMORY;
	p->bDisable = disable;
	p->numChannels = n;
	memcpy(p->hClientList, clients, n * sizeof(*clients));
	memcpy(p->hChannelList, channels, n * sizeof(*channels));
	status = rm_control(hclient, hsubdevice, NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, p,
			    sizeof(*p));
	kfree(p);
	return status;
}

/*
 * The timeslice controls go to a tenant's own TSG, named by the tenant's client handle: a kernel
 * caller is RS_PRIV_LEVEL_KERNEL with no client OS info (XlateUserModeArgsToSecInfo in
 * src/nvidia/src/kernel/rmapi/entry_points.c), which rmclientValidate (src/nvidia/src/kernel/
 * rmapi/client.c) lets reach any client. Numbers and the one-u64 parameter: 580.142's
 * src/common/sdk/nvidia/inc/ctrl/ctrla06c.h (NVA06C_CTRL_TIMESLICE_PARAMS for both).
 */

/**
 * qgpu_rmapi_get_timeslice() - read a TSG's timeslice (NVA06C_CTRL_CMD_GET_TIMESLICE)
 * @hclient: the client the TSG belongs to (a tenant's)
 * @htsg: the TSG (class KEPLER_CHANNEL_GROUP_A)
 * @us: set to the timeslice in microseconds when RM answers NV_OK
 *
 * RM answers what it keeps for the TSG: its default or the value of the last SET_TIMESLICE it
 * carried out (kchangrpapiCtrlCmdGetTimeslice in src/nvidia/src/kernel/gpu/fifo/
 * kernel_channel_group_api.c). Process context: RM may sleep.
 *
 * Return: RM's status (NV_OK on success).
 */
u32 qgpu_rmapi_get_timeslice(u32 hclient, u32 htsg, u64 *us)
{
	struct nva06c_timeslice_params p = { 0 };
	u32 status;

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	status = rm_control(hclient, htsg, NVA06C_CTRL_CMD_GET_TIMESLICE, &p, sizeof(p));
	if (status == NV_OK)
		*us = p.timesliceUs;
	return status;
}

/**
 * qgpu_rmapi_object_lost() - whether RM no longer has a tenant's TSG or channel working
 * @hclient: the tenant's client
 * @hobject: the TSG or channel
 * @channel: whether @hobject is a channel (else a TSG)
 *
 * RM frees an object's dependents with it by invalidating them (serverFreeResourceTree,
 * resserv's rs_server.c, bInvalidateOnly): their handles stay in the client, so
 * CLIENT_GET_HANDLE_INFO still answers NV_OK (measured on an H100: kmod/nvmock/CONFORMANCE.md),
 * while a control on one answers NV_ERR_RESOURCE_LOST before it is looked at (serverControl).
 * A control the host answers, with no effect, is asked of each: of a TSG its timeslice; of a
 * channel the engine of the object named by the client's own handle, which a working channel
 * refuses with NV_ERR_INVALID_ARGUMENT (kchannelCtrlCmdGetClassEngineid_IMPL; measured on an
 * H100, tests/vm/rmcases.py channel_queries). Its work-submit token would do too, but RM
 * writes that into the tenant's notifier (kchannelNotifyWorkSubmitToken).
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 * Return: true where RM answered NV_ERR_RESOURCE_LOST or NV_ERR_OBJECT_NOT_FOUND.
 */
bool qgpu_rmapi_object_lost(u32 hclient, u32 hobject, bool channel)
{
	struct nv906f_class_engineid_params engine = { .hObject = hclient };
	struct nva06c_timeslice_params slice = { 0 };
	u32 status;

	if (!bound)
		return false;
	if (channel)
		status = rm_control(hclient, hobject, NV906F_CTRL_GET_CLASS_ENGINEID, &engine,
				    sizeof(engine));
	else
		status = rm_control(hclient, hobject, NVA06C_CTRL_CMD_GET_TIMESLICE, &slice,
				    sizeof(slice));
	return status == NV_ERR_RESOURCE_LOST || status == NV_ERR_OBJECT_NOT_FOUND;
}

/**
 * qgpu_rmapi_preemption_saves() - how often GR took a TSG's context off the engine mid-work
 * @hclient: the client the TSG belongs to (a tenant's)
 * @hsubdevice: that client's subdevice on the TSG's GPU (RM finds @htsg in its client)
 * @htsg: the TSG
 * @saves: filled with its CILP, CTA and GfxP saves (GR_GET_CTXSW_STATS)
 *
 * A context taken off with a kernel running, by a switch or by FIFO_DISABLE_CHANNELS, is saved
 * so, once a close; one with nothing to run is not (measured on an H100 and an H200:
 * kmod/nvmock/CONFORMANCE.md, the engine). The control goes to GSP (ROUTE_TO_PHYSICAL).
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 * Return: RM's status; NV_ERR_NOT_SUPPORTED without the RM entry.
 */
u32 qgpu_rmapi_preemption_saves(u32 hclient, u32 hsubdevice, u32 htsg, u32 *saves)
{
	struct nv2080_ctxsw_stats_params p = { .hChannel = htsg };
	u32 status;

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	status = rm_control(hclient, hsubdevice, NV2080_CTRL_CMD_GR_GET_CTXSW_STATS, &p,
			    sizeof(p));
	if (status == NV_OK)
		*saves = p.cilpSaveCnt + p.ctaSaveCnt + p.gfxpSaveCnt;
	return status;
}

/**
 * qgpu_rmapi_get_compute_preemption() - read a context's compute preemption mode
 * @hclient: the client the channel belongs to (a tenant's)
 * @hsubdevice: that client's subdevice on the channel's GPU (RM finds @hchannel in its client)
 * @hchannel: a channel of the context
 * @mode: set to NV2080_CTXSW_PREEMPTION_COMPUTE_* when RM answers NV_OK
 *
 * GR_GET_CTXSW_MODES, sent to GSP (ROUTE_TO_PHYSICAL); the doctor's reads of compute channels
 * answered NV_OK and CILP on an H100 and an H200 (docs/levers.md). A TSG's handle is answered
 * NV_ERR_INVALID_CHANNEL (an H200, tools/gpu/preemption_modes.py): name a channel.
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 * Return: RM's status; NV_ERR_NOT_SUPPORTED without the RM entry.
 */
u32 qgpu_rmapi_get_compute_preemption(u32 hclient, u32 hsubdevice, u32 hchannel, u32 *mode)
{
	struct nv2080_ctxsw_modes_params p = { .hChannel = hchannel };
	u32 status;

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	status = rm_control(hclient, hsubdevice, NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, &p,
			    sizeof(p));
	if (status == NV_OK)
		*mode = p.cilpPreemptMode;
	return status;
}

/**
 * qgpu_rmapi_set_compute_preemption() - set a context's compute preemption mode
 * @hclient: the client the channel belongs to (a tenant's)
 * @hsubdevice: that client's subdevice on the channel's GPU
 * @hchannel: a channel of the context, or its TSG (CUDA names the TSG)
 * @mode: NV2080_CTXSW_PREEMPTION_COMPUTE_*
 *
 * GR_SET_CTXSW_PREEMPTION_MODE with the CILP flag alone, so that only the compute mode is
 * read: CUDA's own call in the shipped H200 trace, and the doctor's CTA lever on each compute
 * channel (docs/levers.md). Sent to GSP.
 *
 * Context: process context, qgpu_lock not held (RM sleeps).
 * Return: RM's status; NV_ERR_NOT_SUPPORTED without the RM entry.
 */
u32 qgpu_rmapi_set_compute_preemption(u32 hclient, u32 hsubdevice, u32 hchannel, u32 mode)
{
	struct nv2080_ctxsw_preemption_mode_params p = {
		.flags = NV2080_CTXSW_PREEMPTION_FLAG_CILP,
		.hChannel = hchannel,
		.cilpPreemptMode = mode,
	};

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	return rm_control(hclient, hsubdevice, NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE, &p,
			  sizeof(p));
}

/**
 * qgpu_rmapi_set_timeslice() - set a TSG's timeslice (NVA06C_CTRL_CMD_SET_TIMESLICE)
 * @hclient: the client the TSG belongs to (a tenant's)
 * @htsg: the TSG (class KEPLER_CHANNEL_GROUP_A)
 * @us: the timeslice in microseconds
 *
 * On a GSP GPU RM sends the value to GSP first and keeps it only if GSP answers NV_OK
 * (kchangrpapiCtrlCmdSetTimeslice in kernel_channel_group_api.c); what GSP programs is not
 * published. Process context: RM may sleep.
 *
 * Return: RM's status (NV_OK on success).
 */
u32 qgpu_rmapi_set_timeslice(u32 hclient, u32 htsg, u64 us)
{
	struct nva06c_timeslice_params p = { .timesliceUs = us };

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	return rm_control(hclient, htsg, NVA06C_CTRL_CMD_SET_TIMESLICE, &p, sizeof(p));
}

/*
 * What qgpu learns from RM about a tenant's objects, instead of re-reading the tenant's memory
 * after the driver has copied it (the tenant may have rewritten it meanwhile). Both controls
 * run host-side with no access right; the kernel reaches any client (see above).
 */

/**
 * qgpu_rmapi_handle_info() - a handle's parent or class, from RM (CLIENT_GET_HANDLE_INFO)
 * @hclient: the client to look in (the control is sent to the client itself)
 * @hobject: the handle
 * @index: NV0000_HANDLE_INFO_INDEX_PARENT or NV0000_HANDLE_INFO_INDEX_CLASSID
 * @result: set to the parent's handle or the class when RM answers NV_OK
 *
 * cliresCtrlCmdClientGetHandleInfo (src/nvidia/src/kernel/rmapi/client_resource.c): a handle
 * the client does not have answers NV_ERR_OBJECT_NOT_FOUND; a client that does not exist
 * NV_ERR_INVALID_CLIENT (serverutilGetResourceRef, rs_utils.c, and the control's own lookup).
 * Process context: RM may sleep.
 *
 * Return: RM's status (NV_OK on success), NV_ERR_NOT_SUPPORTED without the RM entry.
 */
u32 qgpu_rmapi_handle_info(u32 hclient, u32 hobject, u32 index, u32 *result)
{
	struct nv0000_handle_info_params p = { .hObject = hobject, .index = index };
	u32 status;

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	status = rm_control(hclient, hclient, NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO, &p,
			    sizeof(p));
	if (status == NV_OK)
		*result = (u32)p.data;
	return status;
}

/**
 * qgpu_rmapi_mem_size() - a memory object's size as RM allocated it (GET_SURFACE_INFO)
 * @hclient: the client of the memory object
 * @hmemory: the memory object
 * @bytes: set to its size when RM answers NV_OK
 *
 * memCtrlCmdGetSurfaceInfoLvm (src/nvidia/src/kernel/gpu/mem_mgr/mem_ctrl.c) answers
 * memdescGetSize, the size after RM's rounding, in two halves (PHYS_SIZE_LO, PHYS_SIZE_HI). The
 * list is an embedded pointer, a kernel address for a kernel caller. Process context.
 *
 * Return: RM's status (NV_OK on success), NV_ERR_NOT_SUPPORTED without the RM entry.
 */
u32 qgpu_rmapi_mem_size(u32 hclient, u32 hmemory, u64 *bytes)
{
	struct nv0041_surface_info list[2] = {
		{ .index = NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE_LO },
		{ .index = NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE_HI },
	};
	struct nv0041_surface_info_params p = {
		.surfaceInfoListSize = ARRAY_SIZE(list),
		.surfaceInfoList = (u64)(uintptr_t)list,
	};
	u32 status;

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	status = rm_control(hclient, hmemory, NV0041_CTRL_CMD_GET_SURFACE_INFO, &p, sizeof(p));
	if (status == NV_OK)
		*bytes = (u64)list[1].data << 32 | list[0].data;
	return status;
}

/**
 * qgpu_rmapi_objects_are_duplicates() - whether two handles of a client share one memory
 * @hclient: the client
 * @hobject1: a memory object of it
 * @hobject2: another
 * @dup: set when RM answers NV_OK
 *
 * CLIENT_OBJECTS_ARE_DUPLICATES: cliresCtrlCmdObjectsAreDuplicates (client_resource.c) and
 * memIsDuplicate (src/nvidia/src/kernel/mem_mgr/mem.c), which compares the two objects' memory
 * descriptors, host-side. Process context.
 *
 * Return: RM's status (NV_OK on success), NV_ERR_NOT_SUPPORTED without the RM entry.
 */
u32 qgpu_rmapi_objects_are_duplicates(u32 hclient, u32 hobject1, u32 hobject2, bool *dup)
{
	struct nv0000_objects_are_duplicates_params p = {
		.hObject1 = hobject1,
		.hObject2 = hobject2,
	};
	u32 status;

	if (!bound)
		return NV_ERR_NOT_SUPPORTED;
	status = rm_control(hclient, hclient, NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES, &p,
			    sizeof(p));
	if (status == NV_OK)
		*dup = p.bDuplicates;
	return status;
}
