// Simulated libdispatch (Debian has none): data objects over caller-owned bytes and a
// serial queue run inline. Real asynchronous queue ordering is only confirmed on a Mac.
#pragma once

#include <stddef.h>

typedef struct sim_dispatch_object* dispatch_object_t;
typedef struct sim_dispatch_object* dispatch_data_t;
typedef struct sim_dispatch_object* dispatch_queue_t;
typedef void (^dispatch_block_t)(void);

#define DISPATCH_DATA_DESTRUCTOR_DEFAULT NULL

#ifdef __cplusplus
extern "C" {
#endif
dispatch_data_t dispatch_data_create(const void* buffer, size_t size, dispatch_queue_t queue,
                                     dispatch_block_t destructor);
void dispatch_release(dispatch_object_t object);
void dispatch_sync(dispatch_queue_t queue, dispatch_block_t block);
#ifdef __cplusplus
}
#endif
