# Helpers shared by the core, the labs and the tests.

# Flags every amplab target gets.
function(amplab_common_flags target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# CUDA for a lab's kernels (*.cu beside its .cpp files, e.g. cuda_kernels). enable_language must
# run in the top directory, above every target that compiles CUDA; the architectures are
# TORCH_CUDA_ARCH_LIST's ("9.0" -> 90), as for src/amplab's kernels.
if(AMPLAB_WITH_CUDA)
  enable_language(CUDA)
  string(REGEX REPLACE "[ ,]+" ";" AMPLAB_CUDA_ARCHS "${TORCH_CUDA_ARCH_LIST}")
  string(REPLACE "+PTX" "" AMPLAB_CUDA_ARCHS "${AMPLAB_CUDA_ARCHS}")
  string(REPLACE "." "" AMPLAB_CUDA_ARCHS "${AMPLAB_CUDA_ARCHS}")
endif()

# The library of one variant of a lab's code from its sources: the .cpp files with torch, the
# .cu files (torch-free kernels and their launchers) compiled by nvcc into <target>_kernels.
function(amplab_lab_library target lab)
  set(_cpp ${ARGN})
  list(FILTER _cpp INCLUDE REGEX "\\.cpp$")
  set(_cu ${ARGN})
  list(FILTER _cu INCLUDE REGEX "\\.cu$")
  add_library(${target} STATIC ${_cpp})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/labs/${lab})
  amplab_torch_target(${target})
  target_link_libraries(${target} PUBLIC amplab::core)
  if(_cu)
    add_library(${target}_kernels STATIC ${_cu})
    target_include_directories(${target}_kernels PUBLIC ${PROJECT_SOURCE_DIR}/labs/${lab} ${PROJECT_SOURCE_DIR}/src)
    set_target_properties(${target}_kernels PROPERTIES CUDA_ARCHITECTURES "${AMPLAB_CUDA_ARCHS}" CUDA_STANDARD 17
                                                       POSITION_INDEPENDENT_CODE ON)
    target_link_libraries(${target} PUBLIC ${target}_kernels)
  endif()
endfunction()

# A target that includes torch: links the core and reuses its precompiled header.
function(amplab_torch_target target)
  target_link_libraries(${target} PRIVATE amplab::core)
  amplab_common_flags(${target})
  if(AMPLAB_PCH)
    target_precompile_headers(${target} REUSE_FROM amplab_core)
  endif()
endfunction()

# The variants this build makes; the first one is what bin/<lab> runs.
if(AMPLAB_VARIANT STREQUAL "both")
  set(AMPLAB_VARIANTS solution starter)
elseif(AMPLAB_VARIANT STREQUAL "solution" OR AMPLAB_VARIANT STREQUAL "starter")
  set(AMPLAB_VARIANTS ${AMPLAB_VARIANT})
else()
  message(FATAL_ERROR "AMPLAB_VARIANT='${AMPLAB_VARIANT}': allowed values are starter, solution, both")
endif()
list(GET AMPLAB_VARIANTS 0 AMPLAB_PRIMARY_VARIANT)
# The variant of a lab that binaries link when that lab is not the one built or graded: the
# instructor's reference where there is one, else (a hand-out) the student's own code.
if(AMPLAB_VARIANT STREQUAL "starter")
  set(AMPLAB_REFERENCE_VARIANT starter)
else()
  set(AMPLAB_REFERENCE_VARIANT solution)
endif()
# The labs whose mechanisms the core's trainer runs (apps/common/mechanisms.cpp).
set(AMPLAB_MECHANISM_LABS amp_training memory_optimization)

# amplab_link_mechanisms(<target> [<lab> <variant>]): links the trainer's mechanisms into
# <target>: the reference variant of every mechanism lab, except <lab>, whose <variant> it takes
# (the lab a binary is built or graded for).
function(amplab_link_mechanisms target)
  set(_own_lab "${ARGV1}")
  set(_own_variant "${ARGV2}")
  target_link_libraries(${target} PRIVATE amplab_mechanisms)
  foreach(mechanism_lab IN LISTS AMPLAB_MECHANISM_LABS)
    if(mechanism_lab STREQUAL _own_lab)
      target_link_libraries(${target} PRIVATE amplab_${mechanism_lab}_${_own_variant})
    else()
      target_link_libraries(${target} PRIVATE amplab_${mechanism_lab}_${AMPLAB_REFERENCE_VARIANT})
    endif()
  endforeach()
endfunction()

# Variants beside those, built from generated sources (their binaries get a suffix):
#  student (AMPLAB_GRADING) one variant per set of TODOs graded together, student_v<n>[_<n>...],
#          from the files scripts/grade writes into <build>/student/<lab>/v.../ (see
#          amplab_add_grading_variants below), linked with this checkout's tests, apps and core.
set(AMPLAB_EXTRA_VARIANTS "")
if(AMPLAB_GRADING AND AMPLAB_BUILD_TESTS)
  list(APPEND AMPLAB_EXTRA_VARIANTS student)
endif()

# amplab_add_lab(<lab>): the lab's functions from starter/<lab> and/or solution/<lab>
# (library amplab_<lab>_<variant>, header in labs/<lab>), and its binary from apps/<lab>:
# bin/<lab> (primary variant) and bin/<lab>-starter when both variants are built. A lab with
# .cu files needs CUDA: without it (a CPU-only torch) the lab is left out.
function(amplab_add_lab lab)
  file(GLOB _any_cu ${PROJECT_SOURCE_DIR}/solution/${lab}/*.cu ${PROJECT_SOURCE_DIR}/starter/${lab}/*.cu)
  if(_any_cu AND NOT AMPLAB_WITH_CUDA)
    message(STATUS "amplab: lab ${lab} left out: its kernels need CUDA (this LibTorch is a CPU build)")
    return()
  endif()
  foreach(variant IN LISTS AMPLAB_VARIANTS)
    file(GLOB _srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${variant}/${lab}/*.cpp ${PROJECT_SOURCE_DIR}/${variant}/${lab}/*.cu)
    if(NOT _srcs)
      message(FATAL_ERROR "lab ${lab}: no sources in ${variant}/${lab}/")
    endif()
    amplab_lab_library(amplab_${lab}_${variant} ${lab} ${_srcs})
  endforeach()
  if("student" IN_LIST AMPLAB_EXTRA_VARIANTS)
    amplab_add_grading_variants(${lab})
  endif()

  # The app: apps/<lab>/*.cpp and the lab's given experiment code, labs/<lab>/*.cpp (no TODOs).
  file(GLOB _app_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/apps/${lab}/*.cpp ${PROJECT_SOURCE_DIR}/labs/${lab}/*.cpp)
  if(_app_srcs)
    add_library(amplab_${lab}_app OBJECT ${_app_srcs})
    target_include_directories(amplab_${lab}_app PRIVATE ${PROJECT_SOURCE_DIR}/labs/${lab} ${PROJECT_SOURCE_DIR}/apps/common)
    amplab_torch_target(amplab_${lab}_app)
    amplab_lab_variants(_variants ${lab})
    foreach(variant IN LISTS _variants)
      if(variant STREQUAL AMPLAB_PRIMARY_VARIANT)
        set(_exe ${lab})
      else()
        set(_exe ${lab}-${variant})
      endif()
      add_executable(${_exe} $<TARGET_OBJECTS:amplab_${lab}_app>)
      if(variant MATCHES "^student_")
        set_target_properties(${_exe} PROPERTIES EXCLUDE_FROM_ALL ON)  # built by scripts/grade
      endif()
      target_link_libraries(${_exe} PRIVATE amplab_${lab}_${variant} amplab::core)
      amplab_link_mechanisms(${_exe} ${lab} ${variant})
    endforeach()
  endif()
endfunction()

# Grading (AMPLAB_GRADING): scripts/grade writes, for each set of TODOs a graded test runs the
# student's code for, a directory <build>/student/<lab>/<variant>/ (variant: v<n>[_<n>...], the
# TODO numbers) holding the lab's files that have those holes, made by make-starter.py's
# variant_text: the student's code in those holes, the reference in the others, chosen when the
# file is made (nothing in the process can switch it). The lab's other files come from the
# reference, compiled once here (amplab_<lab>_ref_<file>). Each variant becomes the library
# amplab_<lab>_student_<variant>, and the lab binary and test binaries of that variant.
function(amplab_add_grading_variants lab)
  file(GLOB _reference CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/solution/${lab}/*.cpp ${PROJECT_SOURCE_DIR}/solution/${lab}/*.cu)
  if(NOT _reference)  # a hand-out: no reference; the student's starter is graded as a whole
    file(GLOB _reference CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/starter/${lab}/*.cpp ${PROJECT_SOURCE_DIR}/starter/${lab}/*.cu)
  endif()
  foreach(_src IN LISTS _reference)
    get_filename_component(_stem ${_src} NAME_WE)
    set(_objects amplab_${lab}_ref_${_stem})
    add_library(${_objects} OBJECT ${_src})
    target_include_directories(${_objects} PRIVATE ${PROJECT_SOURCE_DIR}/labs/${lab} ${PROJECT_SOURCE_DIR}/src)
    if(_src MATCHES "\\.cu$")
      set_target_properties(${_objects} PROPERTIES CUDA_ARCHITECTURES "${AMPLAB_CUDA_ARCHS}" CUDA_STANDARD 17
                                                   POSITION_INDEPENDENT_CODE ON)
    else()
      amplab_torch_target(${_objects})
    endif()
    set_target_properties(${_objects} PROPERTIES EXCLUDE_FROM_ALL ON)
  endforeach()
  file(GLOB _dirs LIST_DIRECTORIES true CONFIGURE_DEPENDS ${PROJECT_BINARY_DIR}/student/${lab}/v*)
  foreach(_dir IN LISTS _dirs)
    if(NOT IS_DIRECTORY ${_dir})
      continue()
    endif()
    get_filename_component(_variant ${_dir} NAME)
    file(GLOB _own CONFIGURE_DEPENDS ${_dir}/*.cpp ${_dir}/*.cu)
    set(_cpp "")
    set(_cu "")
    foreach(_src IN LISTS _reference)
      get_filename_component(_name ${_src} NAME)
      get_filename_component(_stem ${_src} NAME_WE)
      if(EXISTS ${_dir}/${_name})
        set(_file ${_dir}/${_name})
      else()
        set(_file $<TARGET_OBJECTS:amplab_${lab}_ref_${_stem}>)
      endif()
      if(_name MATCHES "\\.cu$")
        list(APPEND _cu ${_file})
      else()
        list(APPEND _cpp ${_file})
      endif()
    endforeach()
    set(_target amplab_${lab}_student_${_variant})
    add_library(${_target} STATIC ${_cpp})
    if(AMPLAB_GRADING_LAUNCHER)  # scripts/grade: the student's files compile as the unprivileged user
      set_target_properties(${_target} PROPERTIES CXX_COMPILER_LAUNCHER "${AMPLAB_GRADING_LAUNCHER}")
    endif()
    target_include_directories(${_target} PUBLIC ${PROJECT_SOURCE_DIR}/labs/${lab})
    amplab_torch_target(${_target})
    if(AMPLAB_GRADING_FLAGS)  # e.g. -Og where no test times the student's host code (scripts/grade)
      separate_arguments(_grading_flags UNIX_COMMAND "${AMPLAB_GRADING_FLAGS}")
      set_source_files_properties(${_cpp} TARGET_DIRECTORY ${_target} PROPERTIES COMPILE_OPTIONS "${_grading_flags}")
    endif()
    target_link_libraries(${_target} PUBLIC amplab::core)
    set_target_properties(${_target} PROPERTIES EXCLUDE_FROM_ALL ON)
    if(_cu)
      add_library(${_target}_kernels STATIC ${_cu})
      target_include_directories(${_target}_kernels PUBLIC ${PROJECT_SOURCE_DIR}/labs/${lab} ${PROJECT_SOURCE_DIR}/src)
      set_target_properties(${_target}_kernels PROPERTIES CUDA_ARCHITECTURES "${AMPLAB_CUDA_ARCHS}" CUDA_STANDARD 17
                                                          POSITION_INDEPENDENT_CODE ON EXCLUDE_FROM_ALL ON)
      if(AMPLAB_GRADING_LAUNCHER)
        set_target_properties(${_target}_kernels PROPERTIES CUDA_COMPILER_LAUNCHER "${AMPLAB_GRADING_LAUNCHER}")
      endif()
      target_link_libraries(${_target} PUBLIC ${_target}_kernels)
    endif()
    set_property(GLOBAL APPEND PROPERTY AMPLAB_GRADING_VARIANTS_${lab} student_${_variant})
  endforeach()
endfunction()

# amplab_lab_variants(<out> <lab>): every variant of a lab's code this build makes: the
# primary and other variants, and the grading variants (student_<variant>).
function(amplab_lab_variants out lab)
  set(_all ${AMPLAB_VARIANTS})
  get_property(_grading GLOBAL PROPERTY AMPLAB_GRADING_VARIANTS_${lab})
  list(APPEND _all ${_grading})
  set(${out} ${_all} PARENT_SCOPE)
endfunction()

# amplab_add_test(<name> SOURCES ... LABELS ... [LIBS ...]): one GoogleTest binary.
function(amplab_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  amplab_torch_target(${name})
  target_link_libraries(${name} PRIVATE amplab_test_support GTest::gtest GTest::gmock ${ARG_LIBS})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DISCOVERY_TIMEOUT 60)
  # Not gtest_discover_tests(PROPERTIES ...): CMake 3.25 splits a list there ("core;slow" gave
  # LABELS core, then "slow" read as a property name). A file ctest reads after the discovered
  # tests (<name>_TESTS lists them) sets the labels, time limit and environment instead.
  set(properties_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_properties.cmake")
  file(WRITE "${properties_file}"
    "if(${name}_TESTS)\n"
    "  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\" TIMEOUT ${ARG_TIMEOUT}\n"
    "    ENVIRONMENT \"AMPLAB_SOURCE_DIR=${PROJECT_SOURCE_DIR};AMPLAB_BINARY_DIR=${PROJECT_BINARY_DIR}\")\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${properties_file}")
endfunction()
