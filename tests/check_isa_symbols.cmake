# Fails when an ISA object (engine/arch/<isa>.cpp or engine/gemm/kernels_<isa>.cpp,
# built with that ISA's flags, including the bf16 units amx and avx512bf16)
# defines a weak or unique function that is not one of kvhead's own kernels
# for that ISA. Such a function (std::copy, an xsimd helper, any inline
# function or template instantiated there) has copies in other objects built
# without the flags, and the linker keeps any one of them: generic code could
# then run AVX-512 instructions on a CPU without them.
#
# Allowed: functions of namespace kvhead::engine whose name carries the ISA's
# xsimd architecture type (the explicit instantiations of the ISA TU and the
# lambdas inside them): no other object can define those. Data (typeinfo, the
# personality reference, static kernel tables) is not code and is not checked.
#
#   cmake -DOBJECTS="<objects>" -P check_isa_symbols.cmake
# The bf16 units' kernels (gemm/kernels_amx.cpp, gemm/kernels_avx512bf16.cpp)
# and the int8 paged kernels (gemm/kernels_avx512vnni.cpp, gemm/kernels_avx2int8.cpp) are local to their TUs: no weak
# function may appear there at all.
set(arch_of_amx "<no weak function: the kernels are local>")
set(arch_of_avx512bf16 "<no weak function: the kernels are local>")
set(arch_of_avx512vnni "<no weak function: the kernels are local>")
set(arch_of_avx2int8 "<no weak function: the kernels are local>")
set(arch_of_avx512 "xsimd::avx512bw")
set(arch_of_avx2 "xsimd::fma3<xsimd::avx2>")
set(arch_of_sse2 "xsimd::sse2")
set(checked 0)
set(problems "")
foreach(object IN LISTS OBJECTS)
  if(NOT object MATCHES "/(arch/|gemm/kernels_)(amx|avx512bf16|avx512vnni|avx512|avx2int8|avx2|sse2)\\.cpp\\.o$")
    continue()
  endif()
  set(arch "${arch_of_${CMAKE_MATCH_2}}")
  math(EXPR checked "${checked} + 1")
  execute_process(COMMAND readelf --wide --syms --demangle "${object}"
                  OUTPUT_VARIABLE symbols RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "readelf failed on ${object}")
  endif()
  string(REPLACE ";" "\\;" symbols "${symbols}")
  string(REPLACE "\n" ";" lines "${symbols}")
  set(kernels 0)
  foreach(line IN LISTS lines)
    # "  Num: Value Size Type Bind Vis Ndx Name": defined (Ndx not UND) weak
    # or unique functions.
    if(NOT line MATCHES "^ *[0-9]+: [0-9a-f]+ +[0-9]+ FUNC +(WEAK|UNIQUE) +[A-Z]+ +[0-9]+ (.*)$")
      continue()
    endif()
    set(name "${CMAKE_MATCH_2}")
    string(FIND "${name}" "(" open)
    if(open EQUAL -1)
      set(open 0)
    endif()
    string(SUBSTRING "${name}" 0 ${open} qualified)
    string(FIND "${qualified}" "kvhead::engine::" in_kvhead)
    string(FIND "${name}" "${arch}" has_arch)
    if(in_kvhead EQUAL -1 OR has_arch EQUAL -1)
      string(APPEND problems "\n  ${object}: ${name}")
    else()
      math(EXPR kernels "${kernels} + 1")
    endif()
  endforeach()
  message(STATUS "${object}: ${kernels} weak ${arch} kernel functions, nothing else")
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no ISA object (arch/<isa>.cpp.o, gemm/kernels_<isa>.cpp.o) among: ${OBJECTS}")
endif()
if(checked LESS 9)
  message(FATAL_ERROR "only ${checked} of the 9 ISA objects found among: ${OBJECTS}")
endif()
if(problems)
  message(FATAL_ERROR "weak functions in ISA objects that other objects may also define:${problems}")
endif()
