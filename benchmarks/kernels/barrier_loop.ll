; AIR kernel for benchmarks/cooperative.py: n threadgroup barriers in a row.
;
;   kernel void barrier_loop(device uint*   out [[buffer(0)]],
;                            constant uint& n   [[buffer(1)]],
;                            uint gid [[thread_position_in_grid]])
;   {
;       uint i = 0;
;       for (; i < n; ++i) threadgroup_barrier(mem_flags::mem_none);
;       out[gid] = i;
;   }
;
; Written in the style of tests/fixtures/threadgroup_sum_float.ll (same barrier call,
; declaration and node shapes).

source_filename = "barrier_loop"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-f32:32:32-f64:64:64-v16:16:16-v24:32:32-v32:32:32-v48:64:64-v64:64:64-v96:128:128-v128:128:128-v192:256:256-v256:256:256-v512:512:512-v1024:1024:1024-n8:16:32"
target triple = "air64_v26-apple-macosx14.0.0"

@llvm.global_ctors = appending global [0 x { i32, ptr, ptr }] zeroinitializer

; Function Attrs: convergent mustprogress nounwind
define weak_odr void @barrier_loop(ptr addrspace(1) noundef "air-buffer-no-alias" %0, ptr addrspace(2) noundef align 4 dereferenceable(4) "air-buffer-no-alias" %1, i32 noundef %2) local_unnamed_addr #0 {
entry:
  %n = load i32, ptr addrspace(2) %1, align 4
  %none = icmp eq i32 %n, 0
  br i1 %none, label %done, label %loop

loop:
  %i = phi i32 [ 0, %entry ], [ %next, %loop ]
  tail call void @air.wg.barrier(i32 0, i32 1) #2
  %next = add nuw i32 %i, 1
  %more = icmp ult i32 %next, %n
  br i1 %more, label %loop, label %done

done:
  %count = phi i32 [ 0, %entry ], [ %next, %loop ]
  %at = zext i32 %2 to i64
  %slot = getelementptr inbounds i32, ptr addrspace(1) %0, i64 %at
  store i32 %count, ptr addrspace(1) %slot, align 4
  ret void
}

; Function Attrs: convergent mustprogress nounwind willreturn
declare void @air.wg.barrier(i32, i32) local_unnamed_addr #1

attributes #0 = { convergent mustprogress nounwind "frame-pointer"="all" "min-legal-vector-width"="0" "no-builtins" "no-trapping-math"="true" "stack-protector-buffer-size"="8" }
attributes #1 = { convergent mustprogress nounwind willreturn }
attributes #2 = { convergent nounwind willreturn }

!llvm.module.flags = !{!0, !1, !2, !3, !4, !5, !6, !7, !8}
!llvm.ident = !{!9}
!air.version = !{!10}
!air.language_version = !{!11}
!air.compile_options = !{!12, !13, !14}
!air.kernel = !{!15}

!0 = !{i32 2, !"SDK Version", [2 x i32] [i32 26, i32 5]}
!1 = !{i32 1, !"wchar_size", i32 4}
!2 = !{i32 7, !"frame-pointer", i32 2}
!3 = !{i32 7, !"air.max_device_buffers", i32 31}
!4 = !{i32 7, !"air.max_constant_buffers", i32 31}
!5 = !{i32 7, !"air.max_threadgroup_buffers", i32 31}
!6 = !{i32 7, !"air.max_textures", i32 128}
!7 = !{i32 7, !"air.max_read_write_textures", i32 8}
!8 = !{i32 7, !"air.max_samplers", i32 16}
!9 = !{!"Apple metal version 32023.883 (metalfe-32023.883)"}
!10 = !{i32 2, i32 6, i32 0}
!11 = !{!"Metal", i32 3, i32 1, i32 0}
!12 = !{!"air.compile.denorms_disable"}
!13 = !{!"air.compile.fast_math_disable"}
!14 = !{!"air.compile.framebuffer_fetch_enable"}
!15 = !{ptr @barrier_loop, !16, !17}
!16 = !{}
!17 = !{!18, !19, !20}
!18 = !{i32 0, !"air.buffer", !"air.location_index", i32 0, i32 1, !"air.read_write", !"air.address_space", i32 1, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"uint", !"air.arg_name", !"out"}
!19 = !{i32 1, !"air.buffer", !"air.buffer_size", i32 4, !"air.location_index", i32 1, i32 1, !"air.read", !"air.address_space", i32 2, !"air.arg_type_size", i32 4, !"air.arg_type_align_size", i32 4, !"air.arg_type_name", !"uint", !"air.arg_name", !"n"}
!20 = !{i32 2, !"air.thread_position_in_grid", !"air.arg_type_name", !"uint", !"air.arg_name", !"gid"}
