# pmindex_install.cmake: the installed library and its package files.
#
# `pmindex` (root CMakeLists.txt) is the in-tree library: every folder adds its
# sources to it with target_sources, and the tests, tools, plugins and
# benchmarks link it with every symbol visible (build/lib/libpmindex_internal.so).
# At the end of configuration (cmake_language DEFER, so that every folder has
# added its sources) those sources move into the object library
# pmindex_objects, compiled once, and two shared libraries are linked from it:
#   pmindex         libpmindex_internal.so   in-tree only, never installed
#   pmindex_public  libpmindex.so.<SOVERSION> -> libpmindex.so.<VERSION>,
#                   exporting only the public API (cmake/pmindex.map), installed
#                   as the imported target pmindex::pmindex.
# A folder adds to the library with target_sources / target_compile_definitions
# / target_compile_options / target_include_directories / target_link_libraries
# on `pmindex` as before (they are copied to pmindex_objects); per-source
# properties set with set_source_files_properties in a folder do not carry
# over (they are directory-scoped), so the library's folders do not use them.
# ABI rule (docs/kv.md): SOVERSION is PMINDEX_ABI_VERSION, bumped whenever a
# change breaks a program linked against the previous libpmindex.so.N (a
# removed or changed exported function, a changed layout of a public struct or
# class, a changed enum value); additions keep N.

set(PMINDEX_ABI_VERSION 0)

function(pmindex_finish_library)
  get_target_property(_srcs pmindex SOURCES)
  add_library(pmindex_objects OBJECT ${_srcs})
  foreach(prop INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS COMPILE_FEATURES)
    get_target_property(_v pmindex ${prop})
    if(_v)
      set_property(TARGET pmindex_objects PROPERTY ${prop} "${_v}")
    endif()
  endforeach()
  get_target_property(_v pmindex INTERFACE_INCLUDE_DIRECTORIES)
  set_property(TARGET pmindex_objects PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_v}")
  get_target_property(_libs pmindex LINK_LIBRARIES)
  if(_libs)
    target_link_libraries(pmindex_objects PRIVATE ${_libs})
  endif()
  set_property(TARGET pmindex PROPERTY SOURCES $<TARGET_OBJECTS:pmindex_objects>)
  if(NOT (PMINDEX_BUILD_TESTS OR PMINDEX_BUILD_TOOLS OR PMINDEX_BUILD_BENCH OR PMINDEX_BUILD_PLUGINS))
    set_property(TARGET pmindex PROPERTY EXCLUDE_FROM_ALL ON)  # nothing in the tree links it
  endif()

  add_library(pmindex_public SHARED $<TARGET_OBJECTS:pmindex_objects>)
  add_library(pmindex::pmindex ALIAS pmindex_public)
  set_target_properties(pmindex_public PROPERTIES
    OUTPUT_NAME pmindex EXPORT_NAME pmindex
    VERSION ${PROJECT_VERSION} SOVERSION ${PMINDEX_ABI_VERSION}
    LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/pmindex.map)
  target_link_options(pmindex_public PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/pmindex.map")
  if(NOT PMINDEX_SANITIZE)  # clang links the sanitizer runtimes into executables only
    target_link_options(pmindex_public PRIVATE "LINKER:--no-undefined")
  endif()
  target_include_directories(pmindex_public PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(pmindex_public INTERFACE cxx_std_20)
  target_link_libraries(pmindex_public PUBLIC Threads::Threads PRIVATE ${_libs})
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL pmindex_finish_library)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
if(PMINDEX_INSTALL)
  cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL pmindex_install_rules)
endif()

function(pmindex_install_rules)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pmindex DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h")
  install(TARGETS pmindex_public EXPORT pmindexTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/pmindex)
  install(EXPORT pmindexTargets NAMESPACE pmindex:: DESTINATION ${_cmakedir})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pmindexConfig.cmake.in
    ${PROJECT_BINARY_DIR}/pmindexConfig.cmake INSTALL_DESTINATION ${_cmakedir})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/pmindexConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/pmindexConfig.cmake ${PROJECT_BINARY_DIR}/pmindexConfigVersion.cmake
          DESTINATION ${_cmakedir})
  # pkg-config: relocatable (prefix found from the .pc file's own place, so
  # `cmake --install --prefix P` works), absolute install dirs kept as given.
  file(RELATIVE_PATH PMINDEX_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(PMINDEX_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
  else()
    set(PMINDEX_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(PMINDEX_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
  else()
    set(PMINDEX_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/pmindex.pc.in ${PROJECT_BINARY_DIR}/pmindex.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pmindex.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/pmindex)
endfunction()
