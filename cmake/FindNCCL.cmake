# FindNCCL: locates NCCL (nccl.h, libnccl.so) and defines the IMPORTED target NCCL::nccl.
# Searches NCCL_ROOT, CUDAToolkit_ROOT and /usr/local/cuda.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${NCCL_ROOT} ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES lib64 lib)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
