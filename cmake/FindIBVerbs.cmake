# FindIBVerbs: locates libibverbs (rdma-core) and defines the IMPORTED target IBVerbs::ibverbs.
find_path(IBVerbs_INCLUDE_DIR infiniband/verbs.h)
find_library(IBVerbs_LIBRARY NAMES ibverbs)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(IBVerbs REQUIRED_VARS IBVerbs_LIBRARY IBVerbs_INCLUDE_DIR)
if(IBVerbs_FOUND AND NOT TARGET IBVerbs::ibverbs)
  add_library(IBVerbs::ibverbs UNKNOWN IMPORTED)
  set_target_properties(IBVerbs::ibverbs PROPERTIES IMPORTED_LOCATION "${IBVerbs_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${IBVerbs_INCLUDE_DIR}")
endif()
mark_as_advanced(IBVerbs_INCLUDE_DIR IBVerbs_LIBRARY)
