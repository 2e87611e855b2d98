// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: memory that leaves its client. Export of an RM object to an fd of /dev/nvidiactl and
 * import from it (NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, _IMPORT_OBJECT_FROM_FD), export to
 * a dma-buf fd (NV_ESC_EXPORT_TO_DMABUF_FD) and fabric memory (NV_MEMORY_FABRIC), as 580.142 does
 * them or, where nvmock's GPU lacks what they need, as the driver answers such a GPU.
 *
 * Export, as RmExportObject (src/nvidia/arch/nvalloc/unix/src/rmobjexportimport.c) does it:
 * RM keeps one client of its own, made when the first object is exported and freed when the last
 * export handle goes (RmRefObjExportImport, RmUnrefObjExportImport), with a device and a
 * subdevice per device instance; the exported object is duplicated under the device (under the
 * subdevice where the device is no valid parent), and that duplicate's handle is what the fd
 * holds. So the memory lives while the fd does, whatever its owner frees; closing the fd frees
 * the duplicate (rm_cleanup_file_private in src/nvidia/arch/nvalloc/unix/src/osapi.c). An import
 * duplicates the fd's object into the importer's client (RmImportObject), another handle to the
 * same memory. The fd must be one of /dev/nvidiactl (nv_get_file_private in
 * kernel-open/nvidia/nv.c: the control device's major and minor) that holds no export yet.
 *
 * Locking: everything here runs under nvmock_lock, as the RM API lock guards the export client.
 */
#include <linux/dma-buf.h>
#include <linux/err.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/slab.h>

#include "nvmock.h"

static const struct nvmock_caller rm_internal = { .kernel = true };

static u32 export_client;			/* hObjExportRmClient; 0: none */
static u32 export_devices[NVMOCK_MAX_GPUS];	/* its device per GPU; 0: none yet */
static u32 export_subdevices[NVMOCK_MAX_GPUS];
static unsigned int export_refs;		/* export handles that hold the client */

/* RmRefObjExportImport: the export client, made on first use. */
static u32 export_ref(void)
{
	u32 status;

	lockdep_assert_held(&nvmock_lock);
	if (!export_refs) {
		u32 handle = 0;

		status = nvmock_rm_alloc(&rm_internal, 0, 0, &handle, NV01_ROOT, NULL, NULL);
		if (status != NV_OK)
			return status;
		export_client = handle;
		memset(export_devices, 0, sizeof(export_devices));
		memset(export_subdevices, 0, sizeof(export_subdevices));
	}
	export_refs++;
	return NV_OK;
}

/* RmUnrefObjExportImport: the client goes with its last export handle. */
static void export_unref(void)
{
	lockdep_assert_held(&nvmock_lock);
	if (--export_refs)
		return;
	nvmock_rm_free(&rm_internal, export_client, export_client, export_client);
	export_client = 0;
}

/* The export client's device and subdevice for a GPU, allocated on first use. */
static u32 export_device(struct nvmock_gpu *gpu)
{
	struct nv0080_alloc_params dev = { .deviceId = gpu->index };
	struct nv2080_alloc_params sub = { 0 };
	u32 hdev = 0, hsub = 0;
	u32 status;

	if (export_devices[gpu->index])
		return NV_OK;
	status = nvmock_rm_alloc(&rm_internal, export_client, export_client, &hdev, NV01_DEVICE_0,
				 NULL, &dev);
	if (status != NV_OK)
		return status;
	status = nvmock_rm_alloc(&rm_internal, export_client, hdev, &hsub, NV20_SUBDEVICE_0, NULL,
				 &sub);
	if (status != NV_OK) {
		nvmock_rm_free(&rm_internal, export_client, export_client, hdev);
		return status;
	}
	export_devices[gpu->index] = hdev;
	export_subdevices[gpu->index] = hsub;
	return NV_OK;
}

/*
 * The device instance RM records for an export: the object's device's deviceInst (nvmock's GPU
 * index, which is the deviceId the device was allocated with), or NV_MAX_DEVICES
 * (src/common/sdk/nvidia/inc/nvlimits.h) for an object with no device above it.
 */
#define EXPORT_NO_DEVICE	32

/*
 * RmExportObject: the object's duplicate in the export client, its handle in *hexport and its
 * device instance in *instance.
 */
static u32 export_object(struct nvmock_client *client, u32 hobject, u32 *hexport, u32 *instance)
{
	struct nvmock_object *src = nvmock_object_get(client, hobject);
	u32 status, parent;

	/* serverutilGetResourceRef: clientGetResourceRef's NV_ERR_OBJECT_NOT_FOUND. */
	if (!src)
		return NV_ERR_OBJECT_NOT_FOUND;
	status = export_ref();
	if (status != NV_OK)
		return status;
	/* No device above it: the duplicate goes under the export client itself. */
	parent = export_client;
	if (src->gpu) {
		status = export_device(src->gpu);
		if (status != NV_OK)
			goto err_unref;
		parent = export_devices[src->gpu->index];
	}
	*hexport = 0;
	status = nvmock_rm_dup(&rm_internal, export_client, parent, hexport, client->handle,
			       hobject);
	if (status == NV_ERR_INVALID_OBJECT_PARENT && src->gpu)
		status = nvmock_rm_dup(&rm_internal, export_client,
				       export_subdevices[src->gpu->index], hexport,
				       client->handle, hobject);
	if (status != NV_OK)
		goto err_unref;
	*instance = src->gpu ? src->gpu->index : EXPORT_NO_DEVICE;
	return NV_OK;

err_unref:
	*hexport = 0;
	export_unref();
	return status;
}

/* RmFreeObjExportHandle */
static void export_free(u32 hexport)
{
	nvmock_rm_free(&rm_internal, export_client, export_client, hexport);
	export_unref();
}

/* nv_get_file_private(fd, NV_TRUE): an open /dev/nvidiactl, with a reference; NULL otherwise. */
static struct file *control_fd(s32 fd)
{
	struct file *file = fget(fd);

	if (!file)
		return NULL;
	if (file->f_op != &nvmock_fops || nvmock_file_of(file)->gpu) {
		fput(file);
		return NULL;
	}
	return file;
}

/*
 * _initializeExportObjectFd (os.c): a control fd is set up for exports once. One that holds
 * exports already answers NV_ERR_STATE_IN_USE; a non-zero hDevice must be an object of the
 * client (NV_ERR_OBJECT_NOT_FOUND) that is a device (NV_ERR_INVALID_PARAMETER), whose instance
 * every object exported to the fd must then share (NV_MAX_DEVICES for hDevice 0); the fd gets
 * max empty slots and the metadata (none: left as it is, zero on a new file).
 */
static u32 export_fd_init(struct nvmock_file *nf, struct nvmock_client *client, u32 hdevice,
			  u16 max, const u8 *metadata)
{
	u32 instance = EXPORT_NO_DEVICE;

	if (nf->export_handles)
		return NV_ERR_STATE_IN_USE;
	if (hdevice) {
		struct nvmock_object *device = nvmock_object_get(client, hdevice);

		if (!device)
			return NV_ERR_OBJECT_NOT_FOUND;
		if (device->kind != NVMOCK_DEVICE)
			return NV_ERR_INVALID_PARAMETER;
		instance = device->gpu->index;
	}
	/* os_alloc_mem: kmalloc, else vmalloc; zeroed by os_mem_set. */
	nf->export_handles = kvcalloc(max, sizeof(*nf->export_handles), GFP_KERNEL);
	if (!nf->export_handles)
		return NV_ERR_NO_MEMORY;
	nf->export_max = max;
	nf->export_instance = instance;
	if (metadata)
		memcpy(nf->export_metadata, metadata, sizeof(nf->export_metadata));
	return NV_OK;
}

/* The fd's slots go (what they held was freed or never there). */
static void export_fd_reset(struct nvmock_file *nf)
{
	kvfree(nf->export_handles);
	nf->export_handles = NULL;
	nf->export_max = 0;
}

/**
 * nvmock_export_to_fd() - NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD on a client.
 * @caller: who sent the control
 * @obj: the client's root object
 * @params: struct nv0000_export_object_to_fd_params, in kernel memory
 *
 * cliresCtrlCmdOsUnixExportObjectToFd_IMPL (src/nvidia/arch/nvalloc/unix/src/os.c): EMPTY_FD
 * is the user library's and refused here, so are a type other than RM and fd -1
 * (NV_ERR_INVALID_PARAMETER); the object is exported first (its errors come first), then the fd
 * must be a control fd (NV_ERR_INVALID_PARAMETER) that _initializeExportObjectFd sets up for one
 * handle (an fd with exports already, the plural's included: NV_ERR_STATE_IN_USE; hDevice as
 * export_fd_init says). Any failure frees the export again.
 *
 * Context: nvmock_lock held.
 * Return: an NV status.
 */
u32 nvmock_export_to_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
			void *params)
{
	struct nv0000_export_object_to_fd_params *p = params;
	struct nvmock_client *client = obj->client;
	struct nvmock_file *nf;
	struct file *file;
	u32 hexport = 0, instance;
	u32 status;

	lockdep_assert_held(&nvmock_lock);
	if (p->flags & NV0000_EXPORT_FLAGS_EMPTY_FD)
		return NV_ERR_INVALID_PARAMETER;
	if (p->type != NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM || p->fd == -1)
		return NV_ERR_INVALID_PARAMETER;
	status = export_object(client, p->hObject, &hexport, &instance);
	if (status != NV_OK)
		return status;
	file = control_fd(p->fd);
	if (!file) {
		status = NV_ERR_INVALID_PARAMETER;
		goto err_free;
	}
	nf = nvmock_file_of(file);
	status = export_fd_init(nf, client, p->hDevice, 1, NULL);
	if (status != NV_OK)
		goto err_put;
	/* The singular export does not compare the object's device with hDevice's. */
	nf->export_handles[0] = hexport;
	fput(file);
	return NV_OK;

err_put:
	fput(file);
err_free:
	export_free(hexport);
	return status;
}

/**
 * nvmock_export_objects_to_fd() - NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD on a client.
 * @caller: who sent the control
 * @obj: the client's root object
 * @params: struct nv0000_export_objects_to_fd_params, in kernel memory
 *
 * cliresCtrlCmdOsUnixExportObjectsToFd_IMPL (os.c), in its order: the fd must be a control fd
 * (NV_ERR_INVALID_PARAMETER; fd -1 too: making a new fd is the user library's); one that holds
 * no export yet is set up for maxObjects slots (0: NV_ERR_INVALID_PARAMETER) with hDevice and
 * the metadata (export_fd_init); one that does keeps its slots, device and metadata, whatever
 * these say (the singular export's fd has one slot). Then numObjects over 512
 * NV_ERR_INVALID_PARAMETER, index + numObjects over the fd's slots NV_ERR_OUT_OF_RANGE. Each
 * non-zero handle is exported (RmExportObject's errors) and its device instance must be the
 * fd's (NV_ERR_INVALID_PARAMETER); only when all are, the slots [index, index + numObjects)
 * take them, what a slot held before freed (a 0 handle empties its slot). On any failure the
 * exports of this call are freed and an fd set up by this call is given its slots back.
 *
 * Context: nvmock_lock held.
 * Return: an NV status.
 */
u32 nvmock_export_objects_to_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
				void *params)
{
	struct nv0000_export_objects_to_fd_params *p = params;
	struct nvmock_client *client = obj->client;
	u32 *exported = NULL;
	struct nvmock_file *nf;
	struct file *file;
	bool set_up = false;
	u32 status, instance, i;

	lockdep_assert_held(&nvmock_lock);
	file = control_fd(p->fd);
	if (!file)
		return NV_ERR_INVALID_PARAMETER;
	nf = nvmock_file_of(file);
	if (!nf->export_handles) {
		if (!p->maxObjects) {
			status = NV_ERR_INVALID_PARAMETER;
			goto out;
		}
		status = export_fd_init(nf, client, p->hDevice, p->maxObjects, p->metadata);
		if (status != NV_OK)
			goto out;
		set_up = true;
	}
	if (p->numObjects > NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS) {
		status = NV_ERR_INVALID_PARAMETER;
		goto out;
	}
	if ((u32)p->index + p->numObjects > nf->export_max) {
		status = NV_ERR_OUT_OF_RANGE;
		goto out;
	}
	/*
	 * RM's array is os_alloc_mem's, not zeroed: on a failure it frees whatever lies past the
	 * failing entry too. nvmock's is zeroed (see CONFORMANCE.md).
	 */
	exported = kcalloc(p->numObjects, sizeof(*exported), GFP_KERNEL);
	if (!exported) {
		status = NV_ERR_NO_MEMORY;
		goto out;
	}
	for (i = 0; i < p->numObjects; i++) {
		if (!p->objects[i])
			continue;
		status = export_object(client, p->objects[i], &exported[i], &instance);
		if (status != NV_OK)
			goto out;
		if (instance != nf->export_instance) {
			status = NV_ERR_INVALID_PARAMETER;
			goto out;
		}
	}
	for (i = 0; i < p->numObjects; i++) {
		u32 *slot = &nf->export_handles[p->index + i];

		if (*slot)
			export_free(*slot);
		*slot = exported[i];
	}
	status = NV_OK;
out:
	if (status != NV_OK && exported) {
		for (i = 0; i < p->numObjects; i++)
			if (exported[i])
				export_free(exported[i]);
	}
	kfree(exported);
	if (status != NV_OK && set_up)
		export_fd_reset(nf);
	fput(file);
	return status;
}

/*
 * RmImportObject (rmobjexportimport.c): the exported object's kind, when asked for, from
 * NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE on the export client (vidmem, sysmem; nvmock
 * exports no other), then a duplicate of it in the importing client under hparent at *hobject
 * (0: RM picks, written back); the duplicate's errors are RM_DUP_OBJECT's.
 */
static u32 import_object(struct nvmock_client *client, u32 hparent, u32 *hobject, u32 hexport,
			 u8 *type)
{
	struct nvmock_client *holder = nvmock_client_get(export_client);
	struct nvmock_object *src;

	/* RmValidateHandleAgainstInternalHandles, mapFind: NV_ERR_INVALID_ARGUMENT. */
	if (!holder || !hexport || hexport == export_client)
		return NV_ERR_INVALID_ARGUMENT;
	if (type) {
		src = nvmock_object_get(holder, hexport);
		if (!src)
			return NV_ERR_INVALID_ARGUMENT;
		if (src->kind == NVMOCK_VIDMEM)
			*type = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM;
		else if (src->kind == NVMOCK_SYSMEM)
			*type = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_SYSMEM;
		else
			return NV_ERR_INVALID_ARGUMENT;
	}
	return nvmock_rm_dup(&rm_internal, client->handle, hparent, hobject, export_client,
			     hexport);
}

/**
 * nvmock_import_from_fd() - NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD on a client.
 * @caller: who sent the control
 * @obj: the client's root object
 * @params: struct nv0000_import_object_from_fd_params, in kernel memory
 *
 * cliresCtrlCmdOsUnixImportObjectFromFd_IMPL (os.c): a type other than RM, fd -1, an fd that is
 * not a control fd or holds nothing in its first slot: NV_ERR_INVALID_PARAMETER. That slot's
 * object is then imported (import_object, no kind asked for).
 *
 * Context: nvmock_lock held.
 * Return: an NV status.
 */
u32 nvmock_import_from_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
			  void *params)
{
	struct nv0000_import_object_from_fd_params *p = params;
	struct nvmock_file *nf;
	struct file *file;
	u32 status;

	lockdep_assert_held(&nvmock_lock);
	if (p->type != NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM || p->fd == -1)
		return NV_ERR_INVALID_PARAMETER;
	file = control_fd(p->fd);
	if (!file)
		return NV_ERR_INVALID_PARAMETER;
	nf = nvmock_file_of(file);
	if (!nf->export_handles || !nf->export_max || !nf->export_handles[0]) {
		fput(file);
		return NV_ERR_INVALID_PARAMETER;
	}
	status = import_object(obj->client, p->hParent, &p->hObject, nf->export_handles[0], NULL);
	fput(file);
	return status;
}

/**
 * nvmock_import_objects_from_fd() - NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD on a client.
 * @caller: who sent the control
 * @obj: the client's root object
 * @params: struct nv0000_import_objects_from_fd_params, in kernel memory
 *
 * cliresCtrlCmdOsUnixImportObjectsFromFd_IMPL (os.c): the fd must be a control fd with exports
 * and numObjects at most 128 (NV_ERR_INVALID_PARAMETER), index + numObjects within its slots
 * (NV_ERR_OUT_OF_RANGE). Slot index + i is imported under hParent at objects[i] (0: RM picks)
 * with its kind in objectTypes[i]; an empty slot answers TYPE_NONE and leaves objects[i] as it
 * is. The first failure stops the loop, and RM frees objects[j] of every j before it that is not
 * 0: what it imported, and also a handle the caller named for an empty slot, one of its own
 * objects (the client's own handle excepted here: see CONFORMANCE.md).
 *
 * Context: nvmock_lock held.
 * Return: an NV status.
 */
u32 nvmock_import_objects_from_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
				  void *params)
{
	struct nv0000_import_objects_from_fd_params *p = params;
	struct nvmock_client *client = obj->client;
	struct nvmock_file *nf;
	struct file *file;
	u32 status = NV_OK;
	u32 i = 0;

	lockdep_assert_held(&nvmock_lock);
	file = control_fd(p->fd);
	if (!file)
		return NV_ERR_INVALID_PARAMETER;
	nf = nvmock_file_of(file);
	if (!nf->export_handles ||
	    p->numObjects > NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS) {
		status = NV_ERR_INVALID_PARAMETER;
		goto out;
	}
	if ((u32)p->index + p->numObjects > nf->export_max) {
		status = NV_ERR_OUT_OF_RANGE;
		goto out;
	}
	for (i = 0; i < p->numObjects; i++) {
		u32 hexport = nf->export_handles[p->index + i];

		if (!hexport) {
			p->objectTypes[i] = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE;
			continue;
		}
		status = import_object(client, p->hParent, &p->objects[i], hexport,
				       &p->objectTypes[i]);
		if (status != NV_OK)
			break;
	}
	if (status != NV_OK) {
		while (i > 0) {
			i--;
			if (p->objects[i] && p->objects[i] != client->handle)
				nvmock_rm_free(&rm_internal, client->handle, client->handle,
					       p->objects[i]);
		}
	}
out:
	fput(file);
	return status;
}

/**
 * nvmock_export_release() - a control file is closing: free what was exported to it.
 * @nf: the file's state
 *
 * rm_cleanup_file_private (src/nvidia/arch/nvalloc/unix/src/osapi.c) frees each export handle
 * the fd holds (RmFreeObjExportHandle); the memory goes with it unless another handle holds it.
 *
 * Context: nvmock_lock held.
 */
void nvmock_export_release(struct nvmock_file *nf)
{
	u32 i;

	lockdep_assert_held(&nvmock_lock);
	if (!nf->export_handles)
		return;
	for (i = 0; i < nf->export_max; i++)
		if (nf->export_handles[i])
			export_free(nf->export_handles[i]);
	export_fd_reset(nf);
}

/**
 * nvmock_export_dmabuf() - NV_ESC_EXPORT_TO_DMABUF_FD, on a GPU's node.
 * @file: the GPU file the escape came through
 * @arg: struct nvrm_export_dmabuf_fd, in kernel memory
 * @size: its size (checked by the dispatcher)
 *
 * nv_dma_buf_export (kernel-open/nvidia/nv-dmabuf.c): no size, no objects, more objects than
 * NV_DMABUF_EXPORT_MAX_HANDLES or than totalObjects, an unknown mappingType, or an fd below -1:
 * NV_ERR_INVALID_ARGUMENT. fd -1 creates a dma-buf (nv_dma_buf_create), which a GPU whose
 * nv->dma_buf_supported is false refuses with NV_ERR_NOT_SUPPORTED; that flag is GSP's answer to
 * GPU_GET_INFO_V2's DMABUF_CAPABILITY (RmInitNvDevice, src/nvidia/arch/nvalloc/unix/src/
 * osinit.c). nvmock's GPU answers "no": its video memory is a window of an emulated BAR, with
 * no pages a dma-buf importer could map. An fd >= 0 adds objects to an existing dma-buf
 * (nv_dma_buf_reuse): an fd that is no dma-buf fails dma_buf_get (NV_ERR_OPERATING_SYSTEM), and
 * since nvmock never makes one, any dma-buf is another driver's (NV_ERR_INVALID_ARGUMENT). The
 * status is in the argument; the ioctl itself succeeds.
 *
 * Return: 0.
 */
long nvmock_export_dmabuf(struct file *file, void *arg, u32 size)
{
	struct nvrm_export_dmabuf_fd *p = arg;
	struct dma_buf *buf;

	if (!p->totalSize || !p->numObjects || !p->totalObjects ||
	    p->numObjects > NV_DMABUF_EXPORT_MAX_HANDLES || p->numObjects > p->totalObjects ||
	    (p->mappingType != NV_DMABUF_EXPORT_MAPPING_TYPE_DEFAULT &&
	     p->mappingType != NV_DMABUF_EXPORT_MAPPING_TYPE_FORCE_PCIE) || p->fd < -1) {
		p->status = NV_ERR_INVALID_ARGUMENT;
		return 0;
	}
	if (p->fd == -1) {
		p->status = NV_ERR_NOT_SUPPORTED;
		return 0;
	}
	buf = dma_buf_get(p->fd);
	if (IS_ERR(buf)) {
		p->status = NV_ERR_OPERATING_SYSTEM;
		return 0;
	}
	dma_buf_put(buf);
	p->status = NV_ERR_INVALID_ARGUMENT;
	return 0;
}

MODULE_IMPORT_NS(DMA_BUF);

/**
 * nvmock_fabric_alloc() - RM_ALLOC of NV_MEMORY_FABRIC, on a GPU without fabric.
 * @caller: who allocates
 * @hroot: the client
 * @hparent: the parent named
 * @have_params: whether parameters were given
 *
 * resource_list.h's entry: the parent must be a subdevice (else NV_ERR_INVALID_OBJECT_PARENT,
 * as for every class) and NV00F8_ALLOCATION_PARAMETERS are RS_REQUIRED. memoryfabricConstruct
 * (src/nvidia/src/kernel/mem_mgr/mem_fabric.c) first needs the GPU's fabric VA space
 * (pGpu->pFabricVAS), which kbusAllocateFlaVaspace (kern_bus_ga100.c, kern_bus_gh100.c) sets up
 * only where FLA is enabled for an NVLink fabric; nvmock's GPU has none: NV_ERR_NOT_SUPPORTED.
 *
 * Context: nvmock_lock held.
 * Return: an NV status.
 */
u32 nvmock_fabric_alloc(const struct nvmock_caller *caller, u32 hroot, u32 hparent,
			bool have_params)
{
	struct nvmock_client *client;
	struct nvmock_object *parent;
	u32 status;

	lockdep_assert_held(&nvmock_lock);
	/* NV00F8's parameters are RS_REQUIRED: checked before the client (nvmock_rm_alloc()). */
	if (!have_params)
		return NV_ERR_INVALID_ARGUMENT;
	status = nvmock_caller_client(caller, hroot, &client);
	if (status != NV_OK)
		return status;
	parent = nvmock_object_get(client, hparent);
	if (!parent)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (parent->kind != NVMOCK_SUBDEVICE)
		return NV_ERR_INVALID_OBJECT_PARENT;
	return NV_ERR_NOT_SUPPORTED;
}
