# slowfs: FUSE pass-through file system with a fixed per-read latency, used by
# tests and benchmarks to make local storage behave like a network file system.
# include()d from tests/CMakeLists.txt; expects find_package(PkgConfig) done.
#
# Paths use CMAKE_CURRENT_LIST_DIR (this file's folder), so the rule works
# whichever CMakeLists.txt includes it.

pkg_check_modules(FUSE3 QUIET IMPORTED_TARGET fuse3)

if(FUSE3_FOUND)
  add_executable(slowfs ${CMAKE_CURRENT_LIST_DIR}/slowfs.c)
  target_link_libraries(slowfs PRIVATE PkgConfig::FUSE3)
  if(TARGET Threads::Threads)
    target_link_libraries(slowfs PRIVATE Threads::Threads)
  endif()
  add_test(NAME slowfs
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/slowfs_test.sh $<TARGET_FILE:slowfs>)
else()
  message(STATUS "fuse3 not found (install libfuse3-dev): slowfs not built, its test will skip")
  add_test(NAME slowfs
           COMMAND sh -c "echo 'SKIP: slowfs not built: fuse3 development files (libfuse3-dev) were not found at configure time'; exit 77")
endif()
set_tests_properties(slowfs PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
# Sanitizers make each 1 MiB request CPU-bound, so the 4-reader overlap ratio
# measures the 2-core CI machine, not slowfs: report it, do not assert it.
if(KVS_ASAN OR KVS_TSAN)
  set_tests_properties(slowfs PROPERTIES ENVIRONMENT "SLOWFS_TEST_NO_TIMING=1")
endif()
