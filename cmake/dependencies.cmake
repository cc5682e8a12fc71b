# Finds the libraries amplab builds on. LibTorch comes from the project's .venv (the torch
# wheel, scripts/setup.sh installs it) unless Torch_DIR or CMAKE_PREFIX_PATH already point at one.
if(NOT Torch_DIR)
  foreach(_py ${PROJECT_SOURCE_DIR}/.venv/bin/python python3)
    execute_process(COMMAND ${_py} -c "import torch; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0 AND _torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
      break()
    endif()
  endforeach()
endif()

# Hopper (H100/H200) unless told otherwise; torch ignores CMAKE_CUDA_ARCHITECTURES.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for torch's CMake")
endif()

# No CUDA toolkit on this machine (no nvcc on PATH, in $CUDA_HOME or /usr/local/cuda): use the
# CUDA compiler scripts/setup.sh installs from pip into .venv, next to the CUDA headers and
# libraries of torch's wheel (site-packages/nvidia/cu13), for torch's CMake files and our kernels.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(_amplab_system_nvcc nvcc HINTS ENV CUDA_HOME PATHS /usr/local/cuda PATH_SUFFIXES bin NO_CACHE)
  file(GLOB _amplab_wheel_nvcc ${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc)
  if(NOT _amplab_system_nvcc AND _amplab_wheel_nvcc)
    list(GET _amplab_wheel_nvcc 0 _amplab_wheel_nvcc)
    get_filename_component(_amplab_cu13 ${_amplab_wheel_nvcc} DIRECTORY)
    get_filename_component(_amplab_cu13 ${_amplab_cu13} DIRECTORY)
    set(CMAKE_CUDA_COMPILER ${_amplab_wheel_nvcc} CACHE FILEPATH "nvcc from pip (no CUDA toolkit here)")
    set(CUDAToolkit_ROOT ${_amplab_cu13})
    set(CUDA_TOOLKIT_ROOT_DIR ${_amplab_cu13} CACHE PATH "CUDA from pip wheels (torch's FindCUDA)")
    message(STATUS "amplab: no CUDA toolkit; the CUDA compiler and libraries of ${_amplab_cu13} (pip wheels)")
  endif()
endif()

find_package(Torch REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(Threads REQUIRED)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
# The grading scripts (rubric checks) read YAML: the project's .venv has PyYAML (scripts/setup.sh).
if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(AMPLAB_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python)
else()
  set(AMPLAB_PYTHON ${Python3_EXECUTABLE})
endif()
if(AMPLAB_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

# torch's CMake target compiles against the CUDA toolkit when the wheel is a CUDA build.
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES OR CUDA_FOUND)
  set(AMPLAB_WITH_CUDA ON)
else()
  set(AMPLAB_WITH_CUDA OFF)
endif()
message(STATUS "amplab: LibTorch ${Torch_VERSION} (CUDA build: ${AMPLAB_WITH_CUDA}), variant ${AMPLAB_VARIANT}")
