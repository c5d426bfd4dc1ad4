# cuFile: the ABI check of shim/cufile_types.h against NVIDIA's cufile.h, the fake
# libcufile.so.0, the engine-like programs and the `gpu` end-to-end test.
# include()d from tests/CMakeLists.txt; paths use CMAKE_CURRENT_LIST_DIR.
#
# The fakes (this libcufile.so.0, and fake_cuda.c's libcuda.so.1) share one folder, which a
# test puts on LD_LIBRARY_PATH in place of the real libraries.
set(KVS_FAKE_DIR ${CMAKE_BINARY_DIR}/tests/fake)

# --- fake libcufile.so.0: the file name is exactly the real SONAME.
add_library(fakecufile SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_cufile.c)
target_include_directories(fakecufile PRIVATE ${CMAKE_SOURCE_DIR}/shim)
target_link_libraries(fakecufile PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
target_link_options(fakecufile PRIVATE -Wl,-z,defs)
kvs_plain(fakecufile)
set_target_properties(fakecufile PROPERTIES
  OUTPUT_NAME cufile
  SOVERSION 0
  LIBRARY_OUTPUT_DIRECTORY ${KVS_FAKE_DIR})
# VERSION unset: the file is libcufile.so.0 itself, with the libcufile.so link beside it.

# --- engines: one source, reaching libcufile by dlopen (-dl) or as a NEEDED library (-ln).
add_executable(kvshim-gpu-engine-dl ${CMAKE_CURRENT_LIST_DIR}/gpu_engine.c)
target_include_directories(kvshim-gpu-engine-dl PRIVATE ${CMAKE_SOURCE_DIR}/shim)
target_link_libraries(kvshim-gpu-engine-dl PRIVATE ${CMAKE_DL_LIBS})
kvs_plain(kvshim-gpu-engine-dl)
add_executable(kvshim-gpu-engine-ln ${CMAKE_CURRENT_LIST_DIR}/gpu_engine.c)
kvs_plain(kvshim-gpu-engine-ln)
target_include_directories(kvshim-gpu-engine-ln PRIVATE ${CMAKE_SOURCE_DIR}/shim)
target_compile_definitions(kvshim-gpu-engine-ln PRIVATE KVS_ENGINE_LINKED)
target_link_libraries(kvshim-gpu-engine-ln PRIVATE fakecufile ${CMAKE_DL_LIBS})

# --- the ABI check needs NVIDIA's cufile.h (the nvidia-cufile wheel) and cuda.h.
if(NOT CUFILE_INCLUDE)
  execute_process(
    COMMAND python3 -c "import nvidia, os; print(';'.join(os.path.join(p, d, 'include') for p in nvidia.__path__ for d in ('cu13', 'cufile')))"
    OUTPUT_VARIABLE kvs_cufile_hint OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(CUFILE_INCLUDE cufile.h PATHS ${kvs_cufile_hint} NO_DEFAULT_PATH)
find_path(CUFILE_INCLUDE cufile.h PATHS /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include)
find_path(KVS_CUDA_H_INCLUDE cuda.h PATHS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
if(CUFILE_INCLUDE AND KVS_CUDA_H_INCLUDE)
  message(STATUS "cufile.h: ${CUFILE_INCLUDE}")
  add_executable(check_cufile_abi ${CMAKE_CURRENT_LIST_DIR}/check_cufile_abi.c)
  target_include_directories(check_cufile_abi PRIVATE ${CUFILE_INCLUDE} ${KVS_CUDA_H_INCLUDE}
    ${CMAKE_SOURCE_DIR}/shim)
  target_link_libraries(check_cufile_abi PRIVATE ${CMAKE_DL_LIBS})
  # Both libraries must export every name callers bind to: the real one where the wheel
  # carries it (nvidia/cu13/lib beside include), and the fake.
  set(kvs_cufile_libs $<TARGET_FILE:fakecufile>)
  if(EXISTS ${CUFILE_INCLUDE}/../lib/libcufile.so.0)
    get_filename_component(kvs_real_cufile ${CUFILE_INCLUDE}/../lib/libcufile.so.0 ABSOLUTE)
    list(APPEND kvs_cufile_libs ${kvs_real_cufile})
  endif()
  add_test(NAME check_cufile_abi COMMAND check_cufile_abi ${kvs_cufile_libs})
else()
  message(STATUS "cufile.h or cuda.h not found (python3 -m pip install nvidia-cufile, or "
    "-DCUFILE_INCLUDE=...): the cuFile ABI check will skip")
  add_test(NAME check_cufile_abi
    COMMAND sh -c "echo 'SKIP: nvidia-cufile wheel not installed: python3 -m pip install nvidia-cufile (or configure with -DCUFILE_INCLUDE=<folder of cufile.h>); cuda.h is needed too'; exit 77")
endif()
set_tests_properties(check_cufile_abi PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)

# --- gpu: 8 engine processes at once per api and link form, under LD_PRELOAD, on the fakes;
# slowfs (when built) for the case of host functions and slow storage.
if(TARGET slowfs)
  set(kvs_gpu_slowfs $<TARGET_FILE:slowfs>)
else()
  set(kvs_gpu_slowfs "")
endif()
add_test(NAME gpu COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/gpu_test.sh
  $<TARGET_FILE:kvshim> $<TARGET_FILE:kvshim-cli> $<TARGET_FILE:kvshim-gpu-engine-dl>
  $<TARGET_FILE:kvshim-gpu-engine-ln> ${KVS_FAKE_DIR} ${kvs_gpu_slowfs})
set_tests_properties(gpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)

# --- gpu_faults: the engine under the shim when something fails (driver missing, copies or
# registration failing, memory the driver does not know, a handle the shim never saw, a
# process killed mid-copy), and the shim's dlsym/dlvsym answers compared with glibc's own.
add_executable(kvshim-gpu-prereg ${CMAKE_CURRENT_LIST_DIR}/gpu_prereg.c)
target_include_directories(kvshim-gpu-prereg PRIVATE ${CMAKE_SOURCE_DIR}/shim)
target_link_libraries(kvshim-gpu-prereg PRIVATE ${CMAKE_DL_LIBS})
kvs_plain(kvshim-gpu-prereg)
# The library defines read(), as an interposer of the program's own would; its dlsym(RTLD_NEXT)
# must be answered from its own place in the search order.
add_library(dlsym_sem_lib SHARED ${CMAKE_CURRENT_LIST_DIR}/dlsym_sem_lib.c)
target_link_libraries(dlsym_sem_lib PRIVATE ${CMAKE_DL_LIBS})
target_link_options(dlsym_sem_lib PRIVATE -Wl,-z,defs)
kvs_plain(dlsym_sem_lib)
add_executable(kvshim-dlsym-sem ${CMAKE_CURRENT_LIST_DIR}/dlsym_sem.c)
target_link_libraries(kvshim-dlsym-sem PRIVATE dlsym_sem_lib ${CMAKE_DL_LIBS})
kvs_plain(kvshim-dlsym-sem)
# A plugin linked to libcufile, loaded RTLD_LOCAL (NIXL's GDS plugin), and the program that
# loads it or reloads libcufile itself.
add_library(cfplug_lib MODULE ${CMAKE_CURRENT_LIST_DIR}/cfplug_lib.c)
target_include_directories(cfplug_lib PRIVATE ${CMAKE_SOURCE_DIR}/shim)
target_link_libraries(cfplug_lib PRIVATE fakecufile)
kvs_plain(cfplug_lib)
add_executable(kvshim-cfplug ${CMAKE_CURRENT_LIST_DIR}/cfplug.c)
target_include_directories(kvshim-cfplug PRIVATE ${CMAKE_SOURCE_DIR}/shim)
target_link_libraries(kvshim-cfplug PRIVATE ${CMAKE_DL_LIBS})
kvs_plain(kvshim-cfplug)
add_executable(kvshim-cfbatch ${CMAKE_CURRENT_LIST_DIR}/cfbatch.c)
target_include_directories(kvshim-cfbatch PRIVATE ${CMAKE_SOURCE_DIR}/shim)
target_link_libraries(kvshim-cfbatch PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
kvs_plain(kvshim-cfbatch)
add_test(NAME gpu_faults COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/gpu_faults_test.sh
  $<TARGET_FILE:kvshim> $<TARGET_FILE:kvshim-cli> $<TARGET_FILE:kvshim-gpu-engine-dl>
  $<TARGET_FILE:kvshim-gpu-prereg> $<TARGET_FILE:kvshim-dlsym-sem> ${KVS_FAKE_DIR}
  $<TARGET_FILE:kvshim-cfplug> $<TARGET_FILE:cfplug_lib> $<TARGET_FILE:kvshim-cfbatch>)
set_tests_properties(gpu_faults PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
