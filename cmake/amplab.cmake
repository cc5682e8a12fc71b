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

  file(GLOB _app_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/apps/${lab}/*.cpp)
  if(_app_srcs)
    add_library(amplab_${lab}_app OBJECT ${_app_srcs})
    target_include_directories(amplab_${lab}_app PRIVATE ${PROJECT_SOURCE_DIR}/labs/${lab})
    amplab_torch_target(amplab_${lab}_app)
    foreach(variant IN LISTS AMPLAB_VARIANTS)
      if(variant STREQUAL AMPLAB_PRIMARY_VARIANT)
        set(_exe ${lab})
      else()
        set(_exe ${lab}-${variant})
      endif()
      add_executable(${_exe} $<TARGET_OBJECTS:amplab_${lab}_app>)
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
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
               ENVIRONMENT "AMPLAB_SOURCE_DIR=${PROJECT_SOURCE_DIR};AMPLAB_BINARY_DIR=${PROJECT_BINARY_DIR}"
    DISCOVERY_TIMEOUT 60)
endfunction()
