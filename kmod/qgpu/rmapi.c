// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the target driver's in-kernel RM entry, through which the schedulers open and close
 * channels as a kernel client (FIFO_DISABLE_CHANNELS, the lever that acts on GSP GPUs).
 *
 * nvmock exports nvmock_get_rm_ops(). nvidia.ko's kernel-client entry has another shape and is
 * not bound yet: with target=nvidia, tracking, the memory gate and the tenant guard work and
 * time slicing is refused (-EOPNOTSUPP). The symbol is taken at run time (symbol_get) so that
 * qgpu loads against either driver.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "../nvmock/nvmock_kapi.h"
#include "qgpu.h"

static struct nvmock_rm_ops rm_ops;
static bool bound;

int qgpu_rmapi_init(void)
{
	int (*get_ops)(struct nvmock_rm_ops *ops);
	int err;

	if (strcmp(qgpu_target, "nvmock"))
		return 0;
	get_ops = symbol_get(nvmock_get_rm_ops);
	if (!get_ops) {
		pr_err("nvmock_get_rm_ops not found\n");
		return -ENODEV;
	}
	strscpy(rm_ops.version_string, NVMOCK_VERSION_STRING, sizeof(rm_ops.version_string));
	err = get_ops(&rm_ops);
	if (err) {
		pr_err("the driver refused RM ops for %s: %d\n", NVMOCK_VERSION_STRING, err);
		symbol_put(nvmock_get_rm_ops);
		return err;
	}
	bound = true;
	return 0;
}

void qgpu_rmapi_exit(void)
{
	if (!bound)
		return;
	bound = false;
	symbol_put(nvmock_get_rm_ops);
}

bool qgpu_rmapi_available(void)
{
	return bound;
}

static u32 rm_alloc(u32 hroot, u32 hparent, u32 *hnew, u32 hclass, void *params)
{
	struct nvmock_kernel_rmapi_op op = { .op = NVMOCK_RMAPI_OP_ALLOC };

	op.params.alloc.hRoot = hroot;
	op.params.alloc.hObjectParent = hparent;
	op.params.alloc.hObjectNew = *hnew;
	op.params.alloc.hClass = hclass;
	op.params.alloc.pAllocParms = (u64)(uintptr_t)params;
	if (rm_ops.op(&op))
		return NV_ERR_NOT_SUPPORTED;
	*hnew = op.params.alloc.hObjectNew;
	return op.params.alloc.status;
}

u32 qgpu_rmapi_free(u32 hclient, u32 hobject)
{
	struct nvmock_kernel_rmapi_op op = { .op = NVMOCK_RMAPI_OP_FREE };

	op.params.free.hRoot = hclient;
	op.params.free.hObjectParent = hclient;
	op.params.free.hObjectOld = hobject;
	if (rm_ops.op(&op))
		return NV_ERR_NOT_SUPPORTED;
	return op.params.free.status;
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
	status = rm_alloc(0, 0, &client, NV01_ROOT, NULL);
	if (status != NV_OK)
		goto err;
	status = rm_alloc(client, client, &hdevice, NV01_DEVICE_0, &device);
	if (status != NV_OK)
		goto err_client;
	status = rm_alloc(client, hdevice, &hsub, NV20_SUBDEVICE_0, &subdevice);
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
	struct nvmock_kernel_rmapi_op op = { .op = NVMOCK_RMAPI_OP_CONTROL };
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
	op.params.control.hClient = hclient;
	op.params.control.hObject = hsubdevice;
	op.params.control.cmd = NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS;
	op.params.control.params = (u64)(uintptr_t)p;
	op.params.control.paramsSize = sizeof(*p);
	status = rm_ops.op(&op) ? NV_ERR_NOT_SUPPORTED : op.params.control.status;
	kfree(p);
	return status;
}
