// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the target driver's in-kernel RM entry, through which the schedulers open and close
 * channels as a kernel client (FIFO_DISABLE_CHANNELS, the lever that acts on GSP GPUs).
 *
 * The entry is nvidia.ko's kernel-client interface, the one nvidia-modeset uses
 * (nvidia_get_rm_ops, declared in ../uapi/nvrm_kapi.h); nvmock exports the same. It is taken at run
 * time (symbol_get), so qgpu loads against either driver, and it needs the driver's exact
 * version: nvmock's is known, nvidia's comes from rm_version= (/sys/module/nvidia/version).
 * Against nvidia.ko this has not run on hardware. Without the entry time slicing is refused
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

static struct nvrm_kernel_ops rm_ops;
/* The driver's stack may be used by one thread at a time: the GPUs' threads share it. */
static DEFINE_MUTEX(rm_stack_lock);
static void *rm_stack;
static bool bound;

/* The version to name: the parameter, else nvmock's own (the mock is built with qgpu). */
static const char *target_version(void)
{
	if (*rm_version)
		return rm_version;
	return strcmp(qgpu_target, "nvmock") ? NULL : NVMOCK_VERSION_STRING;
}

int qgpu_rmapi_init(void)
{
	u32 (*get_ops)(struct nvrm_kernel_ops *ops);
	const char *version = target_version();
	u32 status;

	if (!version) {
		pr_warn("no rm_version=: time slicing is off (tracking and memory limits work)\n");
		return 0;
	}
	get_ops = symbol_get(nvidia_get_rm_ops);
	if (!get_ops) {
		pr_warn("%s has no nvidia_get_rm_ops: time slicing is off\n", qgpu_target);
		return 0;
	}
	rm_ops.version_string = version;
	status = get_ops(&rm_ops);
	if (status != NV_OK || !rm_ops.op || !rm_ops.alloc_stack || !rm_ops.free_stack) {
		pr_warn("%s refused RM ops for version %s (status 0x%x): time slicing is off\n",
			qgpu_target, version, status);
		goto err_put;
	}
	if (rm_ops.alloc_stack(&rm_stack)) {
		pr_warn("no RM stack: time slicing is off\n");
		goto err_put;
	}
	bound = true;
	return 0;

err_put:
	symbol_put(nvidia_get_rm_ops);
	return 0;
}

void qgpu_rmapi_exit(void)
{
	if (!bound)
		return;
	bound = false;
	rm_ops.free_stack(rm_stack);
	rm_stack = NULL;
	symbol_put(nvidia_get_rm_ops);
}

bool qgpu_rmapi_available(void)
{
	return bound;
}

/* One RM call as a kernel client: FREE takes NVOS00, ALLOC NVOS21, CONTROL NVOS54. */
static u32 rm_call(u32 op, void *params)
{
	struct nvrm_kernel_op call = { .op = op };
	struct nvos21_params *alloc = params;

	switch (op) {
	case NVRM_KERNEL_OP_FREE:
		call.params.free = *(struct nvos00_params *)params;
		break;
	case NVRM_KERNEL_OP_ALLOC:
		call.params.alloc = *alloc;
		break;
	default:
		call.params.control = *(struct nvos54_params *)params;
		break;
	}
	mutex_lock(&rm_stack_lock);
	rm_ops.op(rm_stack, &call);
	mutex_unlock(&rm_stack_lock);
	switch (op) {
	case NVRM_KERNEL_OP_FREE:
		return call.params.free.status;
	case NVRM_KERNEL_OP_ALLOC:
		alloc->hObjectNew = call.params.alloc.hObjectNew;
		return call.params.alloc.status;
	default:
		return call.params.control.status;
	}
}

static u32 rm_alloc(u32 hroot, u32 hparent, u32 *hnew, u32 hclass, void *params, u32 size)
{
	struct nvos21_params p = {
		.hRoot = hroot,
		.hObjectParent = hparent,
		.hObjectNew = *hnew,
		.hClass = hclass,
		.pAllocParms = (u64)(uintptr_t)params,
		.paramsSize = size,
	};
	u32 status = rm_call(NVRM_KERNEL_OP_ALLOC, &p);

	*hnew = p.hObjectNew;
	return status;
}

u32 qgpu_rmapi_free(u32 hclient, u32 hobject)
{
	struct nvos00_params p = {
		.hRoot = hclient,
		.hObjectParent = hclient,
		.hObjectOld = hobject,
	};

	return rm_call(NVRM_KERNEL_OP_FREE, &p);
}

/* A kernel client with the GPU's device and subdevice, to send controls from. */
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

void qgpu_rmapi_gpu_close(u32 hclient)
{
	if (bound)
		qgpu_rmapi_free(hclient, hclient);
}

u32 qgpu_rmapi_set_channels(u32 hclient, u32 hsubdevice, bool disable,
			    const u32 *clients, const u32 *channels, u32 n)
{
	struct nv2080_fifo_disable_channels_params *p;
	struct nvos54_params control = {
		.hClient = hclient,
		.hObject = hsubdevice,
		.cmd = NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
	};
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
	control.params = (u64)(uintptr_t)p;
	control.paramsSize = sizeof(*p);
	status = rm_call(NVRM_KERNEL_OP_CONTROL, &control);
	kfree(p);
	return status;
}
