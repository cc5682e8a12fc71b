# Helpers shared by the core, the labs and the tests.

# Flags every amplab target gets.
function(amplab_common_flags target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
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

# Variants beside those, built from generated or copied sources (their binaries get a suffix):
#  holes   (instructor builds) the solution with each TODO's holes switchable to AMPLAB_TODO at
#          run time, so that scripts/check-rubric-holes.py can check, one TODO at a time and from
#          one build, that emptying a hole fails exactly the tests the rubric maps to it;
#  student (AMPLAB_GRADING) the student's starter/<lab>/*.cpp that scripts/grade copies into
#          <build>/student/<lab>/, linked with this checkout's tests, apps and core.
set(AMPLAB_EXTRA_VARIANTS "")
if(AMPLAB_VARIANT STREQUAL "both" AND AMPLAB_HOLE_CHECK AND AMPLAB_BUILD_TESTS)
  list(APPEND AMPLAB_EXTRA_VARIANTS holes)
endif()
if(AMPLAB_GRADING AND AMPLAB_BUILD_TESTS)
  list(APPEND AMPLAB_EXTRA_VARIANTS student)
endif()

# amplab_add_lab(<lab>): the lab's functions from starter/<lab> and/or solution/<lab>
# (library amplab_<lab>_<variant>, header in labs/<lab>), and its binary from apps/<lab>:
# bin/<lab> (primary variant) and bin/<lab>-starter when both variants are built.
function(amplab_add_lab lab)
  foreach(variant IN LISTS AMPLAB_VARIANTS)
    file(GLOB _srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${variant}/${lab}/*.cpp)
    if(NOT _srcs)
      message(FATAL_ERROR "lab ${lab}: no sources in ${variant}/${lab}/")
    endif()
    set(_lib amplab_${lab}_${variant})
    add_library(${_lib} STATIC ${_srcs})
    target_include_directories(${_lib} PUBLIC ${PROJECT_SOURCE_DIR}/labs/${lab})
    amplab_torch_target(${_lib})
    target_link_libraries(${_lib} PUBLIC amplab::core)
  endforeach()
  if("student" IN_LIST AMPLAB_EXTRA_VARIANTS)
    file(GLOB _student_srcs CONFIGURE_DEPENDS ${PROJECT_BINARY_DIR}/student/${lab}/*.cpp)
    if(NOT _student_srcs)  # nothing copied there yet: the starter's, until scripts/grade copies some
      file(GLOB _student_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/starter/${lab}/*.cpp)
    endif()
    add_library(amplab_${lab}_student STATIC ${_student_srcs})
    target_include_directories(amplab_${lab}_student PUBLIC ${PROJECT_SOURCE_DIR}/labs/${lab})
    amplab_torch_target(amplab_${lab}_student)
    target_link_libraries(amplab_${lab}_student PUBLIC amplab::core)
    set_target_properties(amplab_${lab}_student PROPERTIES EXCLUDE_FROM_ALL ON)
  endif()
  if("holes" IN_LIST AMPLAB_EXTRA_VARIANTS)
    file(GLOB _solution_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/solution/${lab}/*.cpp)
    set(_holes_dir ${PROJECT_BINARY_DIR}/holes/${lab})
    set(_holes_srcs "")
    foreach(_src IN LISTS _solution_srcs)
      get_filename_component(_src_name ${_src} NAME)
      list(APPEND _holes_srcs ${_holes_dir}/${_src_name})
    endforeach()
    add_custom_command(OUTPUT ${_holes_srcs}
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/make-starter.py --holes ${lab} ${_holes_dir}
      DEPENDS ${_solution_srcs} ${PROJECT_SOURCE_DIR}/scripts/make-starter.py
      COMMENT "Generating the holes variant of ${lab}" VERBATIM)
    add_library(amplab_${lab}_holes STATIC ${_holes_srcs})
    target_include_directories(amplab_${lab}_holes PUBLIC ${PROJECT_SOURCE_DIR}/labs/${lab}
                               PRIVATE ${PROJECT_SOURCE_DIR}/solution/${lab})
    amplab_torch_target(amplab_${lab}_holes)
    target_link_libraries(amplab_${lab}_holes PUBLIC amplab::core)
  endif()

  file(GLOB _app_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/apps/${lab}/*.cpp)
  if(_app_srcs)
    add_library(amplab_${lab}_app OBJECT ${_app_srcs})
    target_include_directories(amplab_${lab}_app PRIVATE ${PROJECT_SOURCE_DIR}/labs/${lab})
    amplab_torch_target(amplab_${lab}_app)
    foreach(variant IN LISTS AMPLAB_VARIANTS AMPLAB_EXTRA_VARIANTS)
      if(variant STREQUAL AMPLAB_PRIMARY_VARIANT)
        set(_exe ${lab})
      else()
        set(_exe ${lab}-${variant})
      endif()
      add_executable(${_exe} $<TARGET_OBJECTS:amplab_${lab}_app>)
      if(variant STREQUAL "student")
        set_target_properties(${_exe} PROPERTIES EXCLUDE_FROM_ALL ON)  # built by scripts/grade
      endif()
      target_link_libraries(${_exe} PRIVATE amplab_${lab}_${variant} amplab::core)
    endforeach()
  endif()
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
