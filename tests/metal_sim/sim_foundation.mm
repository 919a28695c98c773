// The simulated Foundation and libdispatch (include/Foundation, include/dispatch).
#import <Foundation/Foundation.h>

#include <Block.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

@implementation NSObject
+ (id)alloc {
  return class_createInstance(self, 0);
}
+ (id)new {
  return [[self alloc] init];
}
- (id)init {
  return self;
}
- (void)dealloc {
  object_dispose(self);
}
- (id)retain {
  __atomic_add_fetch(&_sim_references, 1, __ATOMIC_RELAXED);
  return self;
}
- (oneway void)release {
  if (__atomic_fetch_sub(&_sim_references, 1, __ATOMIC_ACQ_REL) == 0) [self dealloc];
}
- (id)autorelease {
  [NSAutoreleasePool addObject:self];
  return self;
}
- (NSUInteger)retainCount {
  return _sim_references + 1;
}
- (BOOL)respondsToSelector:(SEL)aSelector {
  return class_respondsToSelector(object_getClass(self), aSelector);
}
@end

static thread_local std::vector<NSAutoreleasePool*> pools;

@implementation NSAutoreleasePool
- (id)init {
  _sim_objects = new std::vector<id>();
  pools.push_back(self);
  return self;
}
+ (void)addObject:(id)object {
  if (!pools.empty()) static_cast<std::vector<id>*>(pools.back()->_sim_objects)->push_back(object);
  // Outside any pool the object leaks, as on Apple's runtime (which warns).
}
- (void)drain {
  if (!pools.empty() && pools.back() == self) pools.pop_back();
  auto* objects = static_cast<std::vector<id>*>(_sim_objects);
  for (id object : *objects) [object release];
  delete objects;
  [self dealloc];
}
@end

@implementation NSString
+ (NSString*)stringWithUTF8String:(const char*)text {
  NSString* made = [[self alloc] init];
  made->_sim_text = strdup(text);
  return [made autorelease];
}
- (const char*)UTF8String {
  return _sim_text;
}
- (void)dealloc {
  free(_sim_text);
  [super dealloc];
}
@end

@implementation NSError
- (NSString*)localizedDescription {
  return _sim_description;
}
- (void)dealloc {
  [_sim_description release];
  [super dealloc];
}
@end

// --- libdispatch ------------------------------------------------------------------------

struct sim_dispatch_object {
  const void* bytes = nullptr;
  size_t size = 0;
  dispatch_block_t destructor = nullptr;
};

extern "C" dispatch_data_t dispatch_data_create(const void* buffer, size_t size, dispatch_queue_t,
                                                dispatch_block_t destructor) {
  auto* data = new sim_dispatch_object();
  if (destructor == DISPATCH_DATA_DESTRUCTOR_DEFAULT) {  // copied, as libdispatch does
    void* copy = std::malloc(size);
    std::memcpy(copy, buffer, size);
    data->bytes = copy;
    data->destructor = Block_copy(^{
      std::free(copy);
    });
  } else {
    data->bytes = buffer;
    data->destructor = Block_copy(destructor);
  }
  data->size = size;
  return data;
}

extern "C" void dispatch_release(dispatch_object_t object) {
  object->destructor();
  Block_release(object->destructor);
  delete object;
}

static std::recursive_mutex queue_lock;

extern "C" void dispatch_sync(dispatch_queue_t, dispatch_block_t block) {
  std::lock_guard<std::recursive_mutex> lock(queue_lock);  // a serial queue, run inline
  block();
}

// Accessors for the simulated Metal (sim_metal.mm).
const void* sim_data_bytes(dispatch_data_t data) { return data->bytes; }
size_t sim_data_size(dispatch_data_t data) { return data->size; }

// --- file URLs, one-object arrays, errors (binary archives) -------------------------------

@implementation NSURL
+ (NSURL*)fileURLWithPath:(NSString*)path {
  NSURL* made = [[self alloc] init];
  made->_sim_path = strdup([path UTF8String]);
  return [made autorelease];
}
- (void)dealloc {
  free(_sim_path);
  [super dealloc];
}
@end

@implementation NSArray
+ (id)arrayWithObject:(id)anObject {
  NSArray* made = [[self alloc] init];
  made->_sim_objects = new std::vector<id>{[anObject retain]};
  return [made autorelease];
}
- (void)dealloc {
  auto* objects = static_cast<std::vector<id>*>(_sim_objects);
  for (id object : *objects) [object release];
  delete objects;
  [super dealloc];
}
@end

// An autoreleased NSError saying `text` (what the simulated Metal hands back on failure).
NSError* sim_error(const char* text) {
  NSError* error = [[NSError alloc] init];
  error->_sim_description = [[NSString stringWithUTF8String:text] retain];
  return [error autorelease];
}
// The simulated Metal's view of an NSURL and an NSArray.
const char* sim_url_path(NSURL* url) { return url->_sim_path; }
std::vector<id> sim_array_objects(NSArray* array) {
  return array != nil ? *static_cast<std::vector<id>*>(array->_sim_objects) : std::vector<id>();
}
